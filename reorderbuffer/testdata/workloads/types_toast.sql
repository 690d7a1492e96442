-- Mixed types, TOASTed values left unchanged by UPDATE, REPLICA IDENTITY FULL, TRUNCATE with
-- options, transactional and non-transactional logical messages, inside a streamed transaction
-- and around it.
-- setup
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE t (id int PRIMARY KEY, n numeric, ts timestamptz, b bytea, j jsonb, a int[], m mood, big text);
ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE full_t (id int, v text);
ALTER TABLE full_t REPLICA IDENTITY FULL;
CREATE TABLE parent (id serial PRIMARY KEY);
CREATE TABLE child (pid int REFERENCES parent);
INSERT INTO t SELECT g, g * 1.5, '2024-01-01 00:00:00+00'::timestamptz + g * interval '1 hour',
  decode(md5(g::text), 'hex'), jsonb_build_object('g', g, 's', 'x"y'), ARRAY[g, NULL, -g], 'ok',
  repeat(md5(g::text), 200) FROM generate_series(1, 30) g;
-- workload
SELECT pg_logical_emit_message(false, 'nontx', 'before');
BEGIN;
UPDATE t SET n = n + 1 WHERE id <= 30;
INSERT INTO full_t SELECT g, md5(g::text) FROM generate_series(1, 1500) g;
SELECT pg_logical_emit_message(true, 'tx', 'inside');
UPDATE full_t SET v = 'changed' WHERE id <= 10;
DELETE FROM full_t WHERE id > 1490;
INSERT INTO parent SELECT FROM generate_series(1, 5);
INSERT INTO child VALUES (1), (2);
TRUNCATE parent RESTART IDENTITY CASCADE;
INSERT INTO t VALUES (100, NULL, NULL, NULL, NULL, NULL, 'happy', repeat('z', 9000));
UPDATE t SET m = 'sad' WHERE id = 100;
DELETE FROM t WHERE id = 1;
COMMIT;
SELECT pg_logical_emit_message(false, 'nontx', 'after');
UPDATE t SET m = 'happy' WHERE id = 2;
TRUNCATE full_t;
