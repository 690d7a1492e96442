-- The golden workload's changes, streamed after the copy. Blocks are separated by blank lines;
-- each block is one transaction.
INSERT INTO types VALUES (3, -1, 0, -9223372036854775808,
    'NaN', -0.5, 'Infinity', 'NaN', false,
    '', 'x', 'abc', '\x',
    'infinity', '00:00:00', '-infinity', '1970-01-01 00:00:00.001',
    '1969-12-31 23:59:59.999999+00', '-1 days 00:00:01',
    '00000000-0000-0000-0000-000000000000', '[]', '{"z": {"y": [true, false]}, "a": 1}',
    '{}', '{}', 'sad', 'streamed');

UPDATE types SET t = 'updated ✓', n = 0.000, n52 = 0, f8 = -0.0 WHERE id = 1;

INSERT INTO keyed VALUES (3, 'three', 30);
UPDATE keyed SET v = 'uno' WHERE id = 1;

UPDATE keyed SET id = -id WHERE id = 2;

UPDATE keyed SET id = 20, w = 200 WHERE id = 3;

DELETE FROM keyed WHERE id = 1;

INSERT INTO fullpk VALUES (1, 'a');
UPDATE fullpk SET v = 'b' WHERE id = 1;
DELETE FROM fullpk WHERE id = 1;

UPDATE fullpk SET id = 101, v = 'moved' WHERE id = 100;

INSERT INTO uniq VALUES (1, 2, 'a');
UPDATE uniq SET v = 'b' WHERE a = 1;
UPDATE uniq SET b = 3 WHERE a = 1;
DELETE FROM uniq WHERE a = 1;

INSERT INTO nokey VALUES ('x', 1), ('x', 1);
UPDATE nokey SET w = 2 WHERE v = 'copied';
DELETE FROM nokey WHERE v = 'x';

INSERT INTO toasty SELECT 1, string_agg(md5(i::text), ''), 1 FROM generate_series(1, 300) i;
UPDATE toasty SET small = 2 WHERE id = 1;
DELETE FROM toasty WHERE id = 1;

INSERT INTO types (id, n, tstz, ts, ts3, d, tm, f4, f8, iv) VALUES
    (10, 1.50, '2024-02-29 12:34:56.780+00', 'infinity', 'infinity', '-infinity', '23:59:59.999999', 0.1, 0.1, '1 mon'),
    (11, 100, '2024-02-29 12:34:56+00', '2024-02-29 12:34:56', '2024-02-29 12:34:56', '0001-01-01', '00:00:00.5', 3.4e38, 1e300, '-1 year -1 mons +1 days'),
    (12, -0.001, 'infinity', '0001-01-01 00:00:00', '1900-01-01 00:00:00.5', '1900-01-01', '01:02:03', -1.5e-10, -1.5e-10, '1.5 seconds'),
    (13, 0, '-infinity', '1969-12-31 23:59:59.5', '1969-12-31 23:59:59.999', '1969-12-31', '12:00', 0, 0, '0');

INSERT INTO reqd (id, i8, t, b, n, ts, tstz, tm, iv, j, u, by, ai, m)
    VALUES (1, 8, 't', true, 2.5, '2024-02-29 12:00', '2024-02-29 12:00+00', '12:00', '1 day', '{}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '\x01', '{1}', 'ok');
DELETE FROM reqd WHERE id = 1;

INSERT INTO "Odd.Schema"."Mixed Case" VALUES (2, 'streamed');
UPDATE "Odd.Schema"."Mixed Case" SET "Col Name" = NULL WHERE id = 1;

SELECT pg_logical_emit_message(true, 'golden', 'transactional message');
INSERT INTO keyed VALUES (4, 'four', 40);

SELECT pg_logical_emit_message(false, 'golden', 'non-transactional message');

TRUNCATE keyed;

INSERT INTO keyed VALUES (5, 'after truncate', 50);
DELETE FROM types WHERE id = 3;
