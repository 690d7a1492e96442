-- Two concurrent large transactions: one commits, one rolls back.
-- setup
CREATE TABLE t (id int PRIMARY KEY, v text);
-- workload
-- session a
BEGIN;
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 2000) g;
-- session b
BEGIN;
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(100001, 102000) g;
-- session a
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(2001, 4000) g;
-- session b
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(102001, 104000) g;
ROLLBACK;
-- session a
COMMIT;
