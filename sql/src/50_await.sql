-- ---------------------------------------------------------------------------
-- Awaiting an instance
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION @extschema@.gd_await(id bigint, timeout interval DEFAULT '5s', until text DEFAULT 'settled')
RETURNS TABLE (status text, step text, attempt int, result jsonb, error jsonb)
LANGUAGE c AS 'MODULE_PATHNAME', 'gd_door';

-- An instance the caller may not use is not_found at once: nothing, not even
-- when it changes, tells the caller it exists.
CREATE OR REPLACE FUNCTION gd._await(id bigint, timeout interval, until text)
RETURNS TABLE (status text, step text, attempt int, result jsonb, error jsonb)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    caller oid := gd._caller();
    awaited bigint := _await.id;
    deadline timestamptz;
    inst gd._instances;
    remaining_ms double precision;
    published boolean := false;
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
    LOOP
        SELECT * INTO inst FROM gd._instances i WHERE i.id = awaited;
        IF NOT FOUND OR NOT gd._may_use_instance(caller, inst.owner, inst.fsm) THEN
            inst := NULL;
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
        IF NOT published AND (SELECT gd._written_here(i.xmin) FROM gd._instances i WHERE i.id = awaited) THEN
            RAISE EXCEPTION USING ERRCODE = 'invalid_transaction_state',
                MESSAGE = format('gen_durable: gd_await of instance %s in the transaction that wrote it: '
                                 'it cannot move on before this transaction commits', awaited),
                HINT = 'Commit first, then await it.';
        END IF;
        IF NOT published THEN
            -- Published before the next read: a change committed from now on wakes us.
            PERFORM gd._await_publish(awaited);
            published := true;
            CONTINUE;
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
