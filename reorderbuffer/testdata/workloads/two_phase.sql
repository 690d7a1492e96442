-- Two-phase commit: a large (streamed) and a small prepared transaction committed, and one of
-- each rolled back, while other transactions commit in between.
-- setup
CREATE TABLE t (id int PRIMARY KEY, v text);
-- workload
BEGIN;
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 3000) g;
PREPARE TRANSACTION 'big_commit';
BEGIN;
INSERT INTO t VALUES (100001, 'small');
PREPARE TRANSACTION 'small_commit';
BEGIN;
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(200001, 203000) g;
PREPARE TRANSACTION 'big_rollback';
BEGIN;
INSERT INTO t VALUES (300001, 'small');
PREPARE TRANSACTION 'small_rollback';
INSERT INTO t VALUES (400001, 'in between');
COMMIT PREPARED 'small_commit';
ROLLBACK PREPARED 'big_rollback';
COMMIT PREPARED 'big_commit';
ROLLBACK PREPARED 'small_rollback';
