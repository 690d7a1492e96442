-- DDL inside a streamed transaction with a rolled-back savepoint: the schema the server sent
-- inside the rolled-back subtransaction must not leave later changes without their relation.
-- setup
CREATE TABLE t (id int PRIMARY KEY, v text);
CREATE TABLE u (id int PRIMARY KEY, w text);
-- workload
BEGIN;
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 1500) g;
SAVEPOINT s1;
INSERT INTO u SELECT g, md5(g::text) FROM generate_series(1, 1500) g;
ALTER TABLE t ADD COLUMN c2 int;
INSERT INTO t SELECT g, md5(g::text), g FROM generate_series(1501, 2500) g;
ROLLBACK TO SAVEPOINT s1;
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(2501, 3500) g;
INSERT INTO u SELECT g, md5(g::text) FROM generate_series(1501, 1600) g;
SAVEPOINT s2;
ALTER TABLE t ADD COLUMN c3 text DEFAULT 'd';
INSERT INTO t SELECT g, md5(g::text), 'x' FROM generate_series(3501, 4500) g;
RELEASE SAVEPOINT s2;
INSERT INTO u SELECT g, md5(g::text) FROM generate_series(1601, 1700) g;
COMMIT;
INSERT INTO t VALUES (99999, 'after', 'c3');
INSERT INTO u VALUES (99999, 'after');
