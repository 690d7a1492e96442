-- The golden workload's tables and the rows present before the capture starts (copied as "r"
-- events). Blocks are separated by blank lines; each block is one transaction.
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE types (
    id int PRIMARY KEY,
    i2 int2, i4 int4, i8 int8,
    n numeric, n52 numeric(5,2),
    f4 float4, f8 float8,
    b bool,
    t text, vc varchar(10), bpc char(3),
    by bytea,
    d date, tm time, ts timestamp, ts3 timestamp(3), tstz timestamptz, iv interval,
    u uuid, j json, jb jsonb,
    ai int[], at text[],
    m mood,
    nn text NOT NULL DEFAULT 'x'
);
CREATE TABLE keyed (id int PRIMARY KEY, v text NOT NULL, w int);
CREATE TABLE fullpk (id int PRIMARY KEY, v text);
ALTER TABLE fullpk REPLICA IDENTITY FULL;
CREATE TABLE uniq (a int NOT NULL, b int NOT NULL, v text, UNIQUE (a, b));
ALTER TABLE uniq REPLICA IDENTITY FULL;
CREATE TABLE nokey (v text, w int);
ALTER TABLE nokey REPLICA IDENTITY FULL;
CREATE TABLE toasty (id int PRIMARY KEY, big text, small int);
CREATE TABLE reqd (
    id int PRIMARY KEY,
    i int NOT NULL DEFAULT 7, i8 int8 NOT NULL, t text NOT NULL, b bool NOT NULL,
    n numeric NOT NULL, n2 numeric(6,2) NOT NULL DEFAULT 1.5, f float8 NOT NULL DEFAULT 1.5,
    ts timestamp NOT NULL, tstz timestamptz NOT NULL, d date NOT NULL DEFAULT '2020-01-01', tm time NOT NULL,
    iv interval NOT NULL, j jsonb NOT NULL, u uuid NOT NULL, by bytea NOT NULL, ai int[] NOT NULL, m mood NOT NULL,
    bd bool DEFAULT true, td text DEFAULT md5('x'), vd varchar(5) DEFAULT 'v'
);
CREATE SCHEMA "Odd.Schema";
CREATE TABLE "Odd.Schema"."Mixed Case" (id int PRIMARY KEY, "Col Name" text);
CREATE PUBLICATION golden FOR ALL TABLES;

INSERT INTO types VALUES (1, 32767, -2147483648, 9223372036854775807,
    12345678901234567890.123456789, 123.45, 1.5, -2.25, true,
    'héllo wörld ✓ 🐘', 'abc', 'ab', '\xdeadbeef',
    '2024-02-29', '12:34:56.789012', '2024-02-29 12:34:56.789012', '2024-02-29 12:34:56.789',
    '2024-02-29 12:34:56.789012+02', '1 year 2 months 3 days 04:05:06.789',
    'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": [1, 2.5, "x"], "b": null}', '{"a": [1, 2.5, "x"], "b": null}',
    '{1,2,3}', '{"a","b c",NULL}', 'happy', 'copied');
INSERT INTO types (id) VALUES (2);
INSERT INTO keyed VALUES (1, 'one', 10), (2, 'two', NULL);
INSERT INTO fullpk VALUES (100, 'copied');
INSERT INTO uniq VALUES (100, 1, 'copied');
INSERT INTO nokey VALUES ('copied', 1);
INSERT INTO "Odd.Schema"."Mixed Case" VALUES (1, 'copied');
