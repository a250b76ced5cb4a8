-- ---------------------------------------------------------------------------
-- Awaiting an instance
-- ---------------------------------------------------------------------------

CREATE FUNCTION @extschema@.gd_await(id bigint, timeout interval DEFAULT '5s', until text DEFAULT 'settled')
RETURNS TABLE (status text, step text, attempt int, result jsonb, error jsonb)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    awaited bigint := gd_await.id;
    deadline timestamptz;
    inst gd.instances;
    remaining_ms double precision;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_transaction_state',
            MESSAGE = format('gen_durable: gd_await needs READ COMMITTED, not %s',
                             upper(current_setting('transaction_isolation'))),
            HINT = 'Each check must see newly committed rows; call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
    END IF;
    IF awaited IS NULL THEN
        PERFORM gd._bad_argument('gd_await needs an instance id');
    END IF;
    IF timeout IS NULL OR timeout < interval '0' OR timeout > interval '100 years' THEN
        PERFORM gd._bad_argument(format('timeout must be an interval from 0 to 100 years, got %s',
                                        coalesce(timeout::text, 'NULL')));
    END IF;
    IF until IS NULL OR until NOT IN ('settled', 'terminal') THEN
        PERFORM gd._bad_argument(format('until must be settled or terminal, got %L', until));
    END IF;
    deadline := clock_timestamp() + timeout;
    PERFORM gd._await_publish(awaited);
    LOOP
        SELECT * INTO inst FROM gd.instances i WHERE i.id = awaited;
        IF NOT FOUND THEN
            status := 'not_found';
            EXIT;
        END IF;
        status := CASE
            WHEN inst.status = ANY (gd._terminal_statuses()) THEN inst.status
            WHEN until = 'settled' AND inst.status IN ('awaiting_signal', 'awaiting_children') THEN 'awaiting'
        END;
        EXIT WHEN status IS NOT NULL;
        remaining_ms := extract(epoch FROM deadline - clock_timestamp()) * 1000;
        IF remaining_ms <= 0 THEN
            status := 'busy';
            EXIT;
        END IF;
        PERFORM gd._await_sleep(least(ceil(remaining_ms), 2147483647)::int);
    END LOOP;
    PERFORM gd._await_publish(0);
    IF inst.id IS NOT NULL THEN
        step := inst.step;
        attempt := inst.attempt;
        result := inst.result;
        error := inst.error;
    END IF;
    RETURN NEXT;
END $$;
