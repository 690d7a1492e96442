-- One bulk insert, streamed in many blocks.
-- setup
CREATE TABLE t (id int PRIMARY KEY, v text);
-- workload
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 20000) g;
