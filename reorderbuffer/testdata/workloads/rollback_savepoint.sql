-- Rollback to savepoint of 10%, 30% and 50% of a transaction's rows.
-- setup
CREATE TABLE t (id int PRIMARY KEY, v text);
-- workload
BEGIN;
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 1800) g;
SAVEPOINT s;
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1801, 2000) g;
ROLLBACK TO SAVEPOINT s;
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(2001, 2100) g;
COMMIT;
BEGIN;
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(10001, 11400) g;
SAVEPOINT s;
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(11401, 12000) g;
ROLLBACK TO SAVEPOINT s;
COMMIT;
BEGIN;
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(20001, 21000) g;
SAVEPOINT a;
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(21001, 21500) g;
SAVEPOINT b;
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(21501, 22000) g;
RELEASE SAVEPOINT b;
ROLLBACK TO SAVEPOINT a;
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(22001, 22010) g;
COMMIT;
