-- run_at must be a finite time. One pending row at 'infinity' broke every
-- claim of its queue that came up short: the claim computes the wait until
-- the earliest future run_at as run_at - now(), and PostgreSQL cannot
-- subtract infinite timestamps. '-infinity' is refused too: it means "due",
-- which now() says plainly.
-- {{.schema}} is the schema identifier, already quoted by the migrator.

-- Rows that already hold one: a pending job due at infinity would never
-- run, so it is dead with a reason; every other such row takes its
-- created_at.
UPDATE {{.schema}}.jobs
SET status      = CASE WHEN status = 'pending' AND run_at = 'infinity' THEN 'dead' ELSE status END,
    last_error  = CASE WHEN status = 'pending' AND run_at = 'infinity'
                       THEN 'run_at was infinity, a time that never comes; pgdispatch now refuses it at INSERT'
                       ELSE last_error END,
    finished_at = CASE WHEN status = 'pending' AND run_at = 'infinity' THEN now() ELSE finished_at END,
    run_at      = created_at
WHERE NOT isfinite(run_at);

ALTER TABLE {{.schema}}.jobs
    ADD CONSTRAINT jobs_run_at_check CHECK (isfinite(run_at));
