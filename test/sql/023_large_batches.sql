-- Batches larger than an executor's largest pick: one gd_complete_all of
-- 1,500 claims writes every transition and makes room under every
-- concurrency key its instances held, each key having a second instance
-- waiting behind it.  Queue 'big_batches' has no executors.
-- Runs alone too: what 001_setup creates comes from test/sql/include/setup.sql when missing.
\set ECHO none
\getenv abs_srcdir PG_ABS_SRCDIR
\set gd_setup :abs_srcdir '/sql/include/setup.sql'
\i :gd_setup
SELECT gd_define_fsm('big', initial => 'work', queue => 'big_batches');
SELECT gd_define_step('big', 'work');
SELECT count(*) AS inserted
  FROM gd_insert_all('big', (SELECT jsonb_agg(jsonb_build_object('concurrency_key', 'big' || n % 1500,
                                                                 'state', jsonb_build_object('n', n)) ORDER BY n)
                               FROM generate_series(0, 2999) n));
SELECT count(*) FILTER (WHERE gated) AS gated, count(*) FILTER (WHERE NOT gated) AS free
  FROM gd.instances WHERE fsm = 'big';

CREATE TABLE big_claims AS SELECT id, lease_token FROM gd_claim('big_batches', 'big worker', 1000);
INSERT INTO big_claims SELECT id, lease_token FROM gd_claim('big_batches', 'big worker', 1000);
SELECT count(*) AS claimed FROM big_claims;

SELECT count(*) FILTER (WHERE completed) AS completed, count(*) FILTER (WHERE NOT completed) AS stale
  FROM gd_complete_all(ARRAY(SELECT id FROM big_claims ORDER BY id),
                       ARRAY(SELECT lease_token FROM big_claims ORDER BY id),
                       ARRAY(SELECT gd_done(jsonb_build_object('n', id)) FROM big_claims ORDER BY id));
-- Every first holder is done and every waiting instance admitted.
SELECT status, gated, count(*) FROM gd.instances WHERE fsm = 'big' GROUP BY 1, 2 ORDER BY 1, 2;
SELECT count(*) AS claimable_now
  FROM (SELECT id FROM gd_claim('big_batches', 'big worker', 1000)
        UNION ALL SELECT id FROM gd_claim('big_batches', 'big worker', 1000)) c;

DROP TABLE big_claims;
DELETE FROM gd._instances WHERE fsm = 'big';
