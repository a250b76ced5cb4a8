-- ---------------------------------------------------------------------------
-- The reaper: what becomes due without anyone committing anything
-- ---------------------------------------------------------------------------

-- Make a parked instance runnable at its then_step, with what its next step
-- sees in ctx; wakes the queue's executors and its awaiters at commit.
CREATE OR REPLACE FUNCTION gd._resume_parked(instance gd._instances, resume_with jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    next gd._steps;
    route record;
BEGIN
    SELECT * INTO next FROM gd._steps s
     WHERE s.fsm = instance.fsm AND s.version = instance.version AND s.step = instance.wait_then_step;
    route := gd._route(next.queue, coalesce(instance.home_queue, instance.queue));
    UPDATE gd._instances i
       SET status = 'runnable', step = instance.wait_then_step, attempt = 1, resume = resume_with,
           gated = gd._must_gate(instance.owner, instance.concurrency_key),
           external = next.handler IS NULL AND next.step IS NOT NULL, queue = route.queue, home_queue = route.home_queue,
           wait_names = NULL, wait_deadline = NULL, wait_then_step = NULL,
           eligible_at = clock_timestamp(), updated_at = clock_timestamp()
     WHERE i.id = instance.id;
    PERFORM gd._wake_on_commit(route.queue);
    PERFORM gd._wake_awaiters_on_commit(instance.id);
END $$;

-- Waits whose deadline passed resume with ctx.timed_out.  Returns how many.
CREATE OR REPLACE FUNCTION gd._expire_waits(batch int DEFAULT 500) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    expired gd._instances;
    count int := 0;
BEGIN
    FOR expired IN
        SELECT * FROM gd._instances i
         WHERE i.status = 'awaiting_signal' AND i.wait_deadline <= clock_timestamp()
         ORDER BY i.wait_deadline LIMIT batch FOR UPDATE SKIP LOCKED
    LOOP
        PERFORM gd._resume_parked(expired, '{"timed_out": true, "signals": []}');
        count := count + 1;
    END LOOP;
    PERFORM gd._count('await_timeout', count);
    RETURN count;
END $$;

-- Parents (all of them, or those given) whose children have all ended resume
-- with ctx.children.  The check reads committed rows, so the reaper, woken
-- after the last child's commit, always sees every child ended.
CREATE OR REPLACE FUNCTION gd._resume_parents(only_these bigint[] DEFAULT NULL) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    parent gd._instances;
    count int := 0;
BEGIN
    FOR parent IN
        SELECT * FROM gd._instances p
         WHERE p.status = 'awaiting_children' AND (only_these IS NULL OR p.id = ANY (only_these))
           AND NOT EXISTS (SELECT FROM gd._instances c
                            WHERE c.parent_id = p.id
                              AND c.status IN ('runnable', 'executing', 'awaiting_signal', 'awaiting_children'))
         FOR UPDATE OF p SKIP LOCKED
    LOOP
        PERFORM gd._resume_parked(parent, jsonb_build_object('children', coalesce(
            (SELECT jsonb_agg(jsonb_build_object('id', c.id, 'fsm', c.fsm, 'status', c.status,
                                                 'result', c.result, 'error', c.error) ORDER BY c.id)
               FROM gd._instances c WHERE c.parent_id = parent.id), '[]')));
        count := count + 1;
    END LOOP;
    RETURN count;
END $$;

-- One reaper round: returns when the next round is due (NULL: nothing scheduled).
CREATE OR REPLACE FUNCTION gd._reap() RETURNS timestamptz
LANGUAGE plpgsql AS $$
BEGIN
    IF gd._expire_waits() > 0 THEN
        RETURN clock_timestamp();          -- a full batch may leave more: go again
    END IF;
    PERFORM gd._resume_parents();
    PERFORM gd._repair_keys();
    RETURN least((SELECT min(i.wait_deadline) FROM gd._instances i
                   WHERE i.status = 'awaiting_signal' AND i.wait_deadline IS NOT NULL),
                 gd._expire_leases());   -- external work: expired leases, scheduled work come due
END $$;
