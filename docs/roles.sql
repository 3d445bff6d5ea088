-- The privileges of pgdispatch's three roles (docs/security.md, "Roles").
--
-- Run it with psql as the role that owns the schema (the one that ran
-- `pgdispatch migrate`), after each migration:
--
--   psql "$DATABASE_URL" -v schema=pgdispatch -v writer=app_writer \
--        -v worker=pgdispatch_worker -v operator=pgdispatch_operator -f docs/roles.sql
--
-- The roles must exist (CREATE ROLE ... LOGIN); the variables left out take
-- the names below. Running it again changes nothing. Every statement names
-- the schema: no search_path is needed.
--
--   writer    creates jobs: enqueue() and enqueue_checked(), or an INSERT
--             of the columns that describe a job (with ON CONFLICT DO
--             NOTHING and no conflict target: naming dedup_key there needs
--             SELECT on it). It cannot read any job (payloads hold other
--             writers' URLs and credentials), choose a job's id, status,
--             attempts or lease, or change or delete jobs. Application roles
--             whose tables have dispatch triggers need it too: the trigger
--             inserts jobs with the rights of the role that wrote the row.
--   worker    what `pgdispatch run` needs: it reads, claims, updates and
--             purges jobs, keeps the flow keys' state, fires the
--             schedules, reads the signing secrets, and keeps the
--             endpoints' circuit breakers and their events. It inserts no
--             jobs but those of the schedules' slots (fire_schedule_slots())
--             and of the endpoints' events (endpoint_event()), and
--             never runs a migration (`pgdispatch migrate` runs as the
--             owner).
--   operator  what the admin commands need: `stats`, `jobs list|show|retry|
--             cancel|snooze`, `queues list|pause|resume`, `schedules add|
--             list|remove|pause|resume`, `limits set|list|clear`, `secrets
--             rotate|list` (it reads no secret: only the worker does),
--             `endpoints list|events|disable|enable|note`, the SQL
--             functions cancel(), snooze(), pause_queue(), resume_queue(),
--             schedule(), unschedule(), pause_schedule(), resume_schedule(),
--             set_flow_limit(), clear_flow_limit(), rotate_signing_secret(),
--             disable_endpoint(), enable_endpoint() and set_endpoint_note(),
--             `triggers list` and `triggers add`, which also needs
--             the TRIGGER privilege on the application's table (its owner
--             grants it). `triggers remove` drops a trigger, which
--             PostgreSQL allows only the table's owner: run it as that role.

\if :{?schema}
\else
\set schema pgdispatch
\endif
\if :{?writer}
\else
\set writer pgdispatch_writer
\endif
\if :{?worker}
\else
\set worker pgdispatch_worker
\endif
\if :{?operator}
\else
\set operator pgdispatch_operator
\endif

GRANT USAGE ON SCHEMA :"schema" TO :"writer", :"worker", :"operator";

-- writer
GRANT EXECUTE ON FUNCTION
    :"schema".enqueue(text, jsonb, text, timestamptz, smallint, text, integer, text, text, text),
    :"schema".enqueue_checked(text, jsonb, text, timestamptz, smallint, text, integer, text, text, text)
    TO :"writer";
GRANT INSERT (kind, payload, queue, run_at, priority, dedup_key, max_attempts, traceparent, tracestate, flow_key) ON :"schema".jobs TO :"writer";

-- worker
GRANT SELECT, UPDATE, DELETE ON :"schema".jobs TO :"worker";
GRANT SELECT ON :"schema".schema_version, :"schema".queues, :"schema".flow_limits, :"schema".signing_secrets TO :"worker";
GRANT SELECT, INSERT, UPDATE, DELETE ON :"schema".flow_keys TO :"worker";
GRANT SELECT, INSERT, UPDATE, DELETE ON :"schema".endpoints TO :"worker";
GRANT SELECT, UPDATE (reported_at), DELETE ON :"schema".endpoint_events TO :"worker";
GRANT SELECT, UPDATE (next_run_at, last_run_at, runs, missed, caught_up, error, taken, warning) ON :"schema".schedules TO :"worker";
-- insert_scheduled_jobs() is what workers of builds before migration 12 call.
GRANT EXECUTE ON FUNCTION
    :"schema".fire_schedule_slots(bigint[], timestamptz[]),
    :"schema".insert_scheduled_jobs(bigint[], timestamptz[]),
    :"schema".claim_flow(text, integer, text, float8, integer, bigint, text, boolean),
    :"schema".flow_ended(text[]),
    :"schema".record_endpoint_outcomes(text[], integer[], integer[], text[], interval, integer, float8, interval),
    :"schema".record_endpoint_outcomes(text[], integer[], integer[], text[], interval, integer, float8, interval, text, text, jsonb),
    :"schema".record_endpoint_outcomes(text[], integer[], integer[], text[], interval, integer, float8, interval, text, text, jsonb, interval),
    :"schema".endpoint_event(text, text, text, text, text, text, text, jsonb),
    :"schema".wake(text)
    TO :"worker";

-- operator
GRANT SELECT, UPDATE ON :"schema".jobs TO :"operator";
GRANT SELECT ON :"schema".schema_version TO :"operator";
GRANT SELECT, INSERT, UPDATE, DELETE ON :"schema".event_triggers TO :"operator";
GRANT SELECT, INSERT, UPDATE ON :"schema".queues TO :"operator";
GRANT SELECT, INSERT, UPDATE, DELETE ON :"schema".schedules TO :"operator";
GRANT SELECT, INSERT, UPDATE, DELETE ON :"schema".flow_limits TO :"operator";
GRANT SELECT ON :"schema".flow_keys TO :"operator";
GRANT SELECT ON :"schema".endpoints, :"schema".endpoint_events TO :"operator";
GRANT SELECT (id, created_at, expires_at), INSERT (secret), UPDATE (expires_at), DELETE ON :"schema".signing_secrets TO :"operator";
GRANT EXECUTE ON FUNCTION
    :"schema".cancel(bigint[]),
    :"schema".flow_ended(text[]),
    :"schema".snooze(bigint, interval),
    :"schema".pause_queue(text),
    :"schema".resume_queue(text),
    :"schema".schedule(text, text, text, jsonb, text, text, smallint, integer, text, integer, interval, boolean),
    :"schema".unschedule(text),
    :"schema".pause_schedule(text),
    :"schema".resume_schedule(text),
    :"schema".set_flow_limit(text, text, integer, boolean, integer, interval),
    :"schema".clear_flow_limit(text, text),
    :"schema".rotate_signing_secret(bytea, interval),
    :"schema".disable_endpoint(text, text, text, text, jsonb),
    :"schema".enable_endpoint(text, text, text, jsonb),
    :"schema".set_endpoint_note(text, text)
    TO :"operator";
