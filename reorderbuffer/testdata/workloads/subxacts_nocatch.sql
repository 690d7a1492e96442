-- One subtransaction per row, none rolled back.
-- setup
CREATE TABLE t (id int PRIMARY KEY, v text);
-- workload
DO $$
BEGIN
  FOR i IN 1..3000 LOOP
    BEGIN
      INSERT INTO t VALUES (i, repeat(md5(i::text), 2));
    EXCEPTION WHEN division_by_zero THEN
      NULL;
    END;
  END LOOP;
END
$$;
