-- A partition of a sharded gen_durable (sharding/README.md): run in each
-- partition database, after CREATE EXTENSION gen_durable, with
--   psql -v partition=P -v partitions=N -f sharding/partition.sql
-- (N a power of two, 0 <= P < N).  Instance ids then encode the partition:
-- id % N = P, so the router sends every id-addressed call to exactly one
-- partition with no lookup table.  Idempotent: run it again after a restore
-- (pg_dump keeps a sequence's position, not its increment).
\set ON_ERROR_STOP on
SELECT set_config('gd_sharding.partition', :'partition', false),
       set_config('gd_sharding.partitions', :'partitions', false) \gset
DO $$
DECLARE
    p int := current_setting('gd_sharding.partition')::int;
    n int := current_setting('gd_sharding.partitions')::int;
    next_id bigint;
BEGIN
    IF n < 1 OR n & (n - 1) <> 0 OR p < 0 OR p >= n THEN
        RAISE EXCEPTION 'gen_durable sharding: partitions must be a power of two and 0 <= partition < partitions, got % of %', p, n;
    END IF;
    -- the next id of this partition above every id already there
    SELECT (coalesce(max(id), 0) / n + 1) * n + p INTO next_id FROM gd._instances;
    EXECUTE format('ALTER SEQUENCE gd._instances_id_seq INCREMENT BY %s RESTART WITH %s', n, next_id);
END $$;
