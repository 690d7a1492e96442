#!/usr/bin/env bash
# Regenerates the golden captures of package decoding from real PostgreSQL servers.
#
# Usage: make-captures.sh PSQL_CONN_15 PSQL_CONN_18
#   e.g.  make-captures.sh "-h /tmp/pgdec15/sock -p 54715 -U postgres" "-h /tmp/pgdec18/sock -p 54718 -U postgres"
#
# Each server must run with wal_level=logical, max_prepared_transactions=10,
# logical_decoding_work_mem=64kB and max_replication_slots>=8, on a fresh database (the script
# creates and drops a database named capture). Slots are created before the workload and read with
# pg_logical_slot_peek_binary_changes, one slot per option set (reading a slot once with two_phase
# turns two-phase on for that slot for good). Output: one capture per slot, in the format of
# internal/tools/capture (lsn<TAB>xid<TAB>hex), with the workload and the options in '#' comments.
set -euo pipefail
out=$(cd "$(dirname "$0")" && pwd)
c15=$1
c18=$2

workload_schema=$(cat <<'SQL'
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE TABLE t (id int PRIMARY KEY, v text, m mood, p posint);
CREATE TABLE tf (id int, v text);
ALTER TABLE tf REPLICA IDENTITY FULL;
CREATE TABLE toasty (id int PRIMARY KEY, big text, small int);
ALTER TABLE toasty ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE parent (id serial PRIMARY KEY);
CREATE TABLE child (id int REFERENCES parent);
CREATE TABLE big (id int, pad text);
CREATE PUBLICATION pub FOR ALL TABLES;
SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin WHERE roname = 'upstream';
SELECT pg_replication_origin_create('upstream');
SQL
)

# Small transactions: every non-streamed message type. The binary slot is read up to the end of it.
workload_small=$(cat <<'SQL'
INSERT INTO t VALUES (1, 'one', 'happy', 5);
UPDATE t SET v = 'uno' WHERE id = 1;
UPDATE t SET id = 2 WHERE id = 1;
DELETE FROM t WHERE id = 2;
INSERT INTO t VALUES (3, NULL, 'sad', 7);
INSERT INTO tf VALUES (1, 'full');
UPDATE tf SET v = 'fuller' WHERE id = 1;
DELETE FROM tf WHERE id = 1;
INSERT INTO toasty SELECT 1, string_agg(md5(i::text), ''), 1 FROM generate_series(1, 100) i;
UPDATE toasty SET small = 2 WHERE id = 1;
INSERT INTO parent DEFAULT VALUES;
INSERT INTO child VALUES (1);
TRUNCATE parent RESTART IDENTITY CASCADE;
TRUNCATE tf;
SELECT pg_logical_emit_message(false, 'nontx', 'hello');
BEGIN;
INSERT INTO t VALUES (4, 'four', 'ok', 4);
SELECT pg_logical_emit_message(true, 'tx', 'world');
COMMIT;
SELECT pg_replication_origin_session_setup('upstream');
BEGIN;
SELECT pg_replication_origin_xact_setup('0/ABCDEF', '2024-01-02 03:04:05+00');
INSERT INTO t VALUES (5, 'from upstream', 'ok', 5);
COMMIT;
SELECT pg_replication_origin_session_reset();
SQL
)

# Streamed transactions (64kB work mem) and two-phase.
workload_stream=$(cat <<'SQL'
BEGIN;
INSERT INTO big SELECT i, 'row' FROM generate_series(1, 500) i;
SAVEPOINT s1;
INSERT INTO big SELECT i, 'rolled back' FROM generate_series(501, 1100) i;
ROLLBACK TO SAVEPOINT s1;
SAVEPOINT s2;
INSERT INTO big SELECT i, 'kept' FROM generate_series(1101, 1300) i;
RELEASE SAVEPOINT s2;
SELECT pg_logical_emit_message(true, 'tx', 'in stream');
ALTER TABLE big ADD COLUMN extra int;
INSERT INTO big SELECT i, 'after ddl', i FROM generate_series(1301, 1500) i;
COMMIT;
BEGIN;
INSERT INTO big SELECT i, 'aborted' FROM generate_series(1, 500) i;
SAVEPOINT a;
INSERT INTO big SELECT i, 'aborted sub' FROM generate_series(501, 800) i;
ROLLBACK;
BEGIN;
INSERT INTO t VALUES (10, 'prepared', 'ok', 10);
PREPARE TRANSACTION 'g1';
COMMIT PREPARED 'g1';
BEGIN;
INSERT INTO t VALUES (11, 'rolled back prepared', 'ok', 11);
PREPARE TRANSACTION 'g2';
ROLLBACK PREPARED 'g2';
BEGIN;
INSERT INTO big SELECT i, 'prepared stream' FROM generate_series(1, 500) i;
PREPARE TRANSACTION 'g3';
COMMIT PREPARED 'g3';
BEGIN;
INSERT INTO big SELECT i, 'prepared stream rolled back' FROM generate_series(1, 500) i;
PREPARE TRANSACTION 'g4';
ROLLBACK PREPARED 'g4';
SQL
)

# capture CONN SLOT FILE UPTO "OPTIONS" COMMENT
capture() {
	local conn=$1 slot=$2 file=$3 upto=$4 opts=$5 comment=$6
	{
		echo "# $comment"
		psql $conn -d capture -Atc 'SELECT version()' | sed 's/^/# server: /'
		echo "# slot $slot read with pg_logical_slot_peek_binary_changes('$slot', $upto, NULL, $opts)"
		echo "# workload (schema, then slots created, then):"
		if [ "$upto" = NULL ]; then printf '%s\n%s\n' "$workload_small" "$workload_stream"; else printf '%s\n' "$workload_small"; fi | sed 's/^/#   /'
		psql $conn -d capture -AtF $'\t' -c \
			"SELECT lsn, xid, encode(data, 'hex') FROM pg_logical_slot_peek_binary_changes('$slot', $upto, NULL, $opts)"
	} >"$out/$file"
	echo "wrote $file ($(grep -vc '^#' "$out/$file") messages)"
}

run() {
	local conn=$1 ver=$2
	psql $conn -d postgres -qc 'DROP DATABASE IF EXISTS capture' -c 'CREATE DATABASE capture'
	printf '%s\n' "$workload_schema" | psql $conn -d capture -q -v ON_ERROR_STOP=1 -f - >/dev/null
	shift 2
	local s
	for s in "$@"; do
		# name:two_phase
		psql $conn -d capture -qAtc "SELECT pg_create_logical_replication_slot('${s%%:*}', 'pgoutput', false, ${s##*:})" >/dev/null
	done
	printf '%s\n' "$workload_small" | psql $conn -d capture -q -v ON_ERROR_STOP=1 -f - >/dev/null
	psql $conn -d capture -qAtc 'SELECT pg_current_wal_lsn()' >"$out/.upto"
	printf '%s\n' "$workload_stream" | psql $conn -d capture -q -v ON_ERROR_STOP=1 -f - >/dev/null
}

cleanup() {
	local conn=$1; shift
	local s
	for s in "$@"; do psql $conn -d capture -qAtc "SELECT pg_drop_replication_slot('${s%%:*}')" >/dev/null; done
	psql $conn -d postgres -qc 'DROP DATABASE capture'
}

# PostgreSQL 15: protocol 2 streaming on, protocol 3 two-phase, streaming off, binary.
run "$c15" 15 p2:false p3:true off:false bin:false
upto=$(cat "$out/.upto")
capture "$c15" p2 pg15-proto2-stream.txt NULL "'proto_version','2','publication_names','pub','streaming','on','messages','true'" \
	"PostgreSQL 15, protocol 2, streaming on, logical_decoding_work_mem=64kB"
capture "$c15" p3 pg15-proto3-twophase.txt NULL "'proto_version','3','publication_names','pub','streaming','on','two_phase','on','messages','true'" \
	"PostgreSQL 15, protocol 3, streaming on, two_phase on, logical_decoding_work_mem=64kB"
capture "$c15" off pg15-proto1-nostream.txt NULL "'proto_version','1','publication_names','pub','messages','true'" \
	"PostgreSQL 15, protocol 1, streaming off"
capture "$c15" bin pg15-proto2-binary.txt "'$upto'" "'proto_version','2','publication_names','pub','binary','true','messages','true'" \
	"PostgreSQL 15, protocol 2, binary on, streaming off, small transactions only"
cleanup "$c15" p2 p3 off bin

# PostgreSQL 18: protocol 4 streaming parallel + two-phase; protocol 1 (stray Stream Abort).
run "$c18" 18 p4:true p1:false
capture "$c18" p4 pg18-proto4-parallel.txt NULL "'proto_version','4','publication_names','pub','streaming','parallel','two_phase','on','messages','true'" \
	"PostgreSQL 18, protocol 4, streaming parallel, two_phase on, logical_decoding_work_mem=64kB"
capture "$c18" p1 pg18-proto1-nostream.txt NULL "'proto_version','1','publication_names','pub','messages','true'" \
	"PostgreSQL 18, protocol 1, streaming off"
cleanup "$c18" p4 p1
rm -f "$out/.upto"
