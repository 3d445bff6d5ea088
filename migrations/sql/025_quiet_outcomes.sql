-- A worker's outcome that puts a job back to pending for later (a retry
-- after its backoff, a snooze, a job held by an open endpoint) does not
-- notify: the worker that wrote it wakes its own claimer when the job is
-- due (claimer/claimer.go, laterWake). {{.schema}} is the schema
-- identifier and {{.sleep_key}} the schema's half of the sleep key
-- (migration 007).
--
-- Each such notification woke the queue's sleeping claimers to claim
-- nothing, and the outcome's transaction took the sleep key's shared lock
-- until it committed, which a claimer going to sleep waited for: with one
-- endpoint of ten open, its jobs held 20 a second, the other endpoints'
-- jobs started at a median of 1.8 ms rather than 0.6
-- (docs/performance.md, decisions ledger). The worker's outcome statement
-- says it is one (pgdispatch.outcome, transaction-local); an UPDATE of any
-- other writer, and any job due at once, notifies as before.
DROP TRIGGER IF EXISTS jobs_notify_update ON {{.schema}}.jobs;
CREATE TRIGGER jobs_notify_update
    BEFORE UPDATE OF status, run_at, queue ON {{.schema}}.jobs
    FOR EACH ROW
    WHEN (NEW.status = 'pending'
          AND (OLD.status IS DISTINCT FROM 'pending' OR OLD.run_at IS DISTINCT FROM NEW.run_at
               OR OLD.queue IS DISTINCT FROM NEW.queue)
          AND (NEW.run_at <= now() OR current_setting('pgdispatch.outcome', true) IS DISTINCT FROM 'on')
          AND NOT pg_try_advisory_xact_lock_shared({{.sleep_key}}, hashtext(NEW.queue)))
    EXECUTE FUNCTION {{.schema}}.notify_sleeper();
