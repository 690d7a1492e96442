-- One subtransaction per row, a third of them rolled back by a caught exception
-- (the many-subtransactions case of PostgreSQL's pairing-heap discussion, scaled down).
-- setup
CREATE TABLE t (id int PRIMARY KEY, v text);
-- workload
DO $$
BEGIN
  FOR i IN 1..3000 LOOP
    BEGIN
      INSERT INTO t VALUES (i, repeat(md5(i::text), 2));
      IF i % 3 = 0 THEN
        RAISE division_by_zero;
      END IF;
    EXCEPTION WHEN division_by_zero THEN
      NULL;
    END;
  END LOOP;
END
$$;
