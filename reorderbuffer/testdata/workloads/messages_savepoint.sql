-- Transactional logical messages in a streamed transaction: one in a subtransaction that
-- writes nothing else and rolls back, one in a subtransaction with changes that rolls back,
-- one that survives. pgoutput sends a transactional message with the top-level xid, so the
-- stream alone does not say which subtransaction wrote it.
-- setup
CREATE TABLE t (id int PRIMARY KEY, v text);
-- workload
BEGIN;
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 1500) g;
SAVEPOINT only_message;
SELECT pg_logical_emit_message(true, 'p', 'rolled back alone');
ROLLBACK TO SAVEPOINT only_message;
SAVEPOINT with_changes;
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1501, 3000) g;
SELECT pg_logical_emit_message(true, 'p', 'rolled back with changes');
ROLLBACK TO SAVEPOINT with_changes;
SELECT pg_logical_emit_message(true, 'p', 'kept');
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(3001, 4500) g;
COMMIT;
