-- Notify only while a worker sleeps, and tune the jobs table for churn.
-- {{.schema}} is the schema identifier and {{.sleep_key_prefix}} the string
-- literal '<schema>/', both already quoted by the migrator.
--
-- A transaction that has sent NOTIFY takes a database-wide lock at commit, so
-- every notifying writer in the cluster commits one at a time. These triggers
-- notify only when a worker of the queue sleeps. The handshake
-- (docs/architecture.md, "Quiet writers"):
--   - a worker that is about to sleep takes the queue's sleep key exclusively,
--     at session level, and keeps it while it sleeps. That request waits for
--     every writer holding the key shared, so once granted, their rows are
--     committed; the worker then looks once more and sleeps;
--   - a writer tries to take the key shared until its commit. Granted: no
--     worker sleeps, and one that goes to sleep will wait for this commit and
--     then see the row, so no NOTIFY is needed. Refused: a worker sleeps or is
--     going to, so the writer notifies.
-- Advisory locks are not MVCC, so this holds in every isolation level. Two
-- keys that hash alike only cost extra notifications, never a lost one.
--
-- The try runs in the triggers' WHEN clauses, so that a writer enters
-- PL/pgSQL only to notify. The triggers are BEFORE triggers, whose WHEN is
-- evaluated as each row is written, and the function records in a
-- transaction-local setting that it has notified the queue: the rest of a
-- bulk insert or COPY then skips the call. (AFTER triggers evaluate WHEN for
-- every row before the first call.) The function has no SET clause, since
-- leaving such a function undoes its set_config.
--
-- Future rows notify too: a woken worker claims nothing yet, learns the
-- earliest run_at and sleeps until then.

DROP TRIGGER jobs_notify_insert ON {{.schema}}.jobs;
DROP TRIGGER jobs_notify_update ON {{.schema}}.jobs;
DROP FUNCTION {{.schema}}.notify_inserted();
DROP FUNCTION {{.schema}}.notify_updated();

CREATE FUNCTION {{.schema}}.notify_sleeper() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_catalog.pg_notify(TG_TABLE_SCHEMA, NEW.queue),
            pg_catalog.set_config('pgdispatch.notified',
                                  pg_catalog.concat(TG_TABLE_SCHEMA, '/', NEW.queue), true);
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_notify_insert
    BEFORE INSERT ON {{.schema}}.jobs
    FOR EACH ROW
    WHEN (NEW.status = 'pending'
          AND NOT pg_try_advisory_xact_lock_shared(hashtext('pgdispatch.sleep'), hashtext({{.sleep_key_prefix}} || NEW.queue))
          AND current_setting('pgdispatch.notified', true) IS DISTINCT FROM {{.sleep_key_prefix}} || NEW.queue)
    EXECUTE FUNCTION {{.schema}}.notify_sleeper();

-- A job made pending again (a retry, a rescue, an operator's UPDATE), or
-- moved in time. The claimer's own updates (to running, done or dead) fail
-- the first test and cost nothing.
CREATE TRIGGER jobs_notify_update
    BEFORE UPDATE OF status, run_at ON {{.schema}}.jobs
    FOR EACH ROW
    WHEN (NEW.status = 'pending'
          AND (OLD.status IS DISTINCT FROM 'pending' OR OLD.run_at IS DISTINCT FROM NEW.run_at)
          AND NOT pg_try_advisory_xact_lock_shared(hashtext('pgdispatch.sleep'), hashtext({{.sleep_key_prefix}} || NEW.queue))
          AND current_setting('pgdispatch.notified', true) IS DISTINCT FROM {{.sleep_key_prefix}} || NEW.queue)
    EXECUTE FUNCTION {{.schema}}.notify_sleeper();

-- Every claim and completion writes a new row version, and none can be HOT
-- (status is in the partial indexes' predicates). Room on each page keeps a
-- row's versions together, and autovacuum visits the table after a thousand
-- or so changes rather than after a fifth of it, with no cost-based pauses:
-- a healthy queue table is small, so a visit is short.
ALTER TABLE {{.schema}}.jobs SET (
    fillfactor = 80,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0
);
