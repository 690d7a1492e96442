-- pgbench-style small transactions from several clients, committing while two large
-- transactions stream around them.
-- setup
CREATE TABLE accounts (aid int PRIMARY KEY, abalance int, filler text);
CREATE TABLE history (aid int, delta int, note text);
INSERT INTO accounts SELECT g, 0, '' FROM generate_series(1, 100) g;
-- workload
-- session big1
BEGIN;
INSERT INTO history SELECT g % 100, g, md5(g::text) FROM generate_series(1, 2500) g;
-- session big2
BEGIN;
INSERT INTO history SELECT g % 100, -g, md5(g::text) FROM generate_series(1, 2500) g;
-- session c1
BEGIN; UPDATE accounts SET abalance = abalance + 5 WHERE aid = 1; INSERT INTO history VALUES (1, 5, 'c1'); COMMIT;
-- session c2
BEGIN; UPDATE accounts SET abalance = abalance - 3 WHERE aid = 2; INSERT INTO history VALUES (2, -3, 'c2'); COMMIT;
-- session big1
UPDATE accounts SET abalance = abalance + 1 WHERE aid > 50;
INSERT INTO history SELECT g % 100, g, md5(g::text) FROM generate_series(2501, 5000) g;
-- session c3
BEGIN; UPDATE accounts SET abalance = abalance + 7 WHERE aid = 3; INSERT INTO history VALUES (3, 7, 'c3'); COMMIT;
-- session big2
INSERT INTO history SELECT g % 100, -g, md5(g::text) FROM generate_series(2501, 5000) g;
COMMIT;
-- session c1
BEGIN; UPDATE accounts SET abalance = abalance + 5 WHERE aid = 4; INSERT INTO history VALUES (4, 5, 'c1'); COMMIT;
-- session big1
COMMIT;
-- session c2
BEGIN; UPDATE accounts SET abalance = abalance - 3 WHERE aid = 5; INSERT INTO history VALUES (5, -3, 'c2'); COMMIT;
