-- The events of the endpoints' circuits, and the operator's overrides
-- (docs/operations.md, "Endpoints and the circuit breaker"). {{.schema}} is
-- the schema identifier and {{.schema_literal}} its name as a string
-- literal.
--
-- 1. An endpoint may be disabled: by the breaker, when it has been open
--    longer than the worker's HTTP_BREAKER_DISABLE_AFTER, or by an
--    operator (disable_endpoint). A disabled endpoint takes no probe and
--    opens no more; its jobs fail at once, dead, with a last_error that
--    says how to enable it and retry them. enable_endpoint closes it.
--    note is the operator's (set_endpoint_note, disable_endpoint).
-- 2. Each change that an operator should hear of (opened from closed,
--    closed by a probe, disabled, enabled) is a row of endpoint_events,
--    written in the transaction that changes the endpoint, and, when the
--    caller names a kind, a job of that kind in the same transaction. One
--    worker logs and counts each event (reported_at). The workers'
--    sweepers delete the events as old as the dead jobs they purge.

ALTER TABLE {{.schema}}.endpoints
    ADD COLUMN IF NOT EXISTS disabled_at timestamptz,
    ADD COLUMN IF NOT EXISTS disabled_by text
        CONSTRAINT endpoints_disabled_by_check CHECK (disabled_by IN ('breaker', 'operator')),
    ADD COLUMN IF NOT EXISTS note text CONSTRAINT endpoints_note_check CHECK (char_length(note) BETWEEN 1 AND 1000);

COMMENT ON COLUMN {{.schema}}.endpoints.disabled_at IS
    'when the endpoint was disabled: its jobs fail, dead, until an operator enables it';
COMMENT ON COLUMN {{.schema}}.endpoints.note IS
    'the operator''s note';

-- endpoint_events: what happened to the endpoints' circuits, newest last.
--   event     opened (from closed: too many failures), closed (a probe
--             succeeded), disabled, enabled.
--   actor     breaker (a worker) or operator; by_role is the session's role.
--   reason    the last failure before it, redacted as last_error is.
--   note      the operator's note.
--   job_id    the job that tells of it, when the caller named a kind.
CREATE TABLE IF NOT EXISTS {{.schema}}.endpoint_events (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint    text        NOT NULL CONSTRAINT endpoint_events_endpoint_check CHECK (char_length(endpoint) BETWEEN 1 AND 300),
    event       text        NOT NULL
                            CONSTRAINT endpoint_events_event_check CHECK (event IN ('opened', 'closed', 'disabled', 'enabled')),
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text        NOT NULL CONSTRAINT endpoint_events_actor_check CHECK (actor IN ('breaker', 'operator')),
    by_role     text        NOT NULL DEFAULT session_user,
    reason      text        CONSTRAINT endpoint_events_reason_check CHECK (char_length(reason) <= 300),
    note        text        CONSTRAINT endpoint_events_note_check CHECK (char_length(note) <= 1000),
    job_id      bigint,
    reported_at timestamptz
);

CREATE INDEX IF NOT EXISTS endpoint_events_unreported_idx ON {{.schema}}.endpoint_events (id) WHERE reported_at IS NULL;
CREATE INDEX IF NOT EXISTS endpoint_events_endpoint_idx ON {{.schema}}.endpoint_events (endpoint, id);
CREATE INDEX IF NOT EXISTS endpoint_events_at_idx ON {{.schema}}.endpoint_events (at);

COMMENT ON TABLE {{.schema}}.endpoint_events IS
    'the endpoints'' circuits opened, closed, disabled and enabled; purged as dead jobs are';

REVOKE ALL ON {{.schema}}.endpoint_events FROM PUBLIC;

-- endpoint_event records an event of endpoint and tells the workers on
-- pgdispatch.control. With job_kind, it also inserts a job of that kind in
-- job_queue ('default' when NULL) whose payload is job_payload (an object,
-- '{}' when NULL) with the event {event_id, endpoint, event, at, by,
-- reason, note} in data for http_callback, in body for rabbitmq, and merged
-- into it for any other kind. It returns the event's id. It runs with its
-- owner's rights, so that the worker and the operator's functions may
-- insert the event's job and no other.
CREATE OR REPLACE FUNCTION {{.schema}}.endpoint_event(
    endpoint text, event text, actor text, reason text, note text,
    job_kind text, job_queue text, job_payload jsonb)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET pgdispatch.firing = 'off'
AS $$
#variable_conflict use_column
DECLARE
    ev      {{.schema}}.endpoint_events;
    body    jsonb;
    payload jsonb := coalesce(job_payload, '{}');
    field   text;
    job     bigint;
BEGIN
    INSERT INTO {{.schema}}.endpoint_events AS x (endpoint, event, actor, reason, note)
    VALUES (endpoint_event.endpoint, endpoint_event.event, endpoint_event.actor,
            pg_catalog.left(endpoint_event.reason, 300), endpoint_event.note)
    RETURNING * INTO ev;
    IF job_kind IS NOT NULL THEN
        IF pg_catalog.jsonb_typeof(payload) <> 'object' THEN
            RAISE EXCEPTION 'endpoint_event: the job''s payload must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
        END IF;
        body := pg_catalog.jsonb_build_object('event_id', ev.id, 'endpoint', ev.endpoint, 'event', ev.event, 'at', ev.at,
                                              'by', ev.actor, 'reason', ev.reason, 'note', ev.note);
        field := CASE job_kind WHEN 'http_callback' THEN 'data' WHEN 'rabbitmq' THEN 'body' END;
        IF field IS NULL THEN
            payload := payload || body;
        ELSE
            IF pg_catalog.jsonb_typeof(payload -> field) = 'object' THEN
                body := (payload -> field) || body;
            END IF;
            payload := pg_catalog.jsonb_set(payload, ARRAY[field], body);
        END IF;
        INSERT INTO {{.schema}}.jobs AS j (kind, queue, payload)
        VALUES (job_kind, coalesce(job_queue, 'default'), payload)
        RETURNING j.id INTO job;
        UPDATE {{.schema}}.endpoint_events x SET job_id = job WHERE x.id = ev.id;
    END IF;
    PERFORM pg_catalog.pg_notify('pgdispatch.control',
        pg_catalog.jsonb_build_object('schema', {{.schema_literal}}, 'endpoints', true, 'endpoint', ev.endpoint)::text);
    RETURN ev.id;
END
$$;

REVOKE ALL ON FUNCTION {{.schema}}.endpoint_event(text, text, text, text, text, text, text, jsonb) FROM PUBLIC;

-- record_endpoint_outcomes, as in migration 019, but a disabled endpoint
-- does not open, and each endpoint that opens is an event (endpoint_event,
-- with event_kind, event_queue and event_payload for its job).
CREATE OR REPLACE FUNCTION {{.schema}}.record_endpoint_outcomes(
    endpoints text[], attempts integer[], failures integer[], reasons text[],
    win interval, min_attempts integer, fail_ratio float8, cool_down interval,
    event_kind text, event_queue text, event_payload jsonb)
RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    i integer;
    e {{.schema}}.endpoints;
BEGIN
    FOR i IN 1 .. coalesce(pg_catalog.array_length(record_endpoint_outcomes.endpoints, 1), 0) LOOP
        INSERT INTO {{.schema}}.endpoints AS x (endpoint) VALUES (record_endpoint_outcomes.endpoints[i])
        ON CONFLICT (endpoint) DO NOTHING;
        SELECT * INTO e FROM {{.schema}}.endpoints x WHERE x.endpoint = record_endpoint_outcomes.endpoints[i] FOR UPDATE;
        IF e.window_started_at <= now() - win THEN
            e.attempts := 0;
            e.failures := 0;
            e.window_started_at := now();
        END IF;
        e.attempts := e.attempts + record_endpoint_outcomes.attempts[i];
        e.failures := e.failures + record_endpoint_outcomes.failures[i];
        IF record_endpoint_outcomes.failures[i] > 0 AND reasons[i] IS NOT NULL THEN
            e.reason := pg_catalog.left(reasons[i], 300);
        END IF;
        IF e.state = 'closed' AND e.disabled_at IS NULL
           AND e.attempts >= min_attempts AND e.failures >= fail_ratio * e.attempts THEN
            e.state := 'open';
            e.opened_at := now();
            e.cool_down := record_endpoint_outcomes.cool_down;
            e.open_until := now() + record_endpoint_outcomes.cool_down;
            e.attempts := 0;
            e.failures := 0;
            e.window_started_at := now();
            PERFORM {{.schema}}.endpoint_event(e.endpoint, 'opened', 'breaker', e.reason, NULL,
                                               event_kind, event_queue, event_payload);
            RETURN NEXT e.endpoint;
        END IF;
        UPDATE {{.schema}}.endpoints x
        SET state = e.state, attempts = e.attempts, failures = e.failures, window_started_at = e.window_started_at,
            opened_at = e.opened_at, open_until = e.open_until, cool_down = e.cool_down, reason = e.reason,
            updated_at = now()
        WHERE x.endpoint = e.endpoint;
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION {{.schema}}.record_endpoint_outcomes(text[], integer[], integer[], text[], interval, integer, float8,
    interval, text, text, jsonb) FROM PUBLIC;

-- The form of migration 019, which workers of earlier builds call: the
-- same, with no job.
CREATE OR REPLACE FUNCTION {{.schema}}.record_endpoint_outcomes(
    endpoints text[], attempts integer[], failures integer[], reasons text[],
    win interval, min_attempts integer, fail_ratio float8, cool_down interval)
RETURNS SETOF text
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT {{.schema}}.record_endpoint_outcomes(endpoints, attempts, failures, reasons, win, min_attempts, fail_ratio,
                                                cool_down, NULL, NULL, NULL)
$$;

-- check_endpoint refuses what is not an endpoint as the breaker writes
-- it: scheme://host:port, lowercase.
CREATE OR REPLACE FUNCTION {{.schema}}.check_endpoint(endpoint text) RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF endpoint IS NULL OR endpoint !~ '^[a-z][a-z0-9+.-]*://([^/?#@:\[\]A-Z]+|\[[0-9a-f:.]+\]):[0-9]{1,5}$'
       OR pg_catalog.char_length(endpoint) > 300 THEN
        RAISE EXCEPTION 'not an endpoint: %', endpoint
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'An endpoint is a URL''s scheme, lowercased host and port, as endpoints list shows it: https://hooks.example.com:443.';
    END IF;
END
$$;

-- disable_endpoint disables endpoint, which need not have been seen yet:
-- its jobs fail, dead, until enable_endpoint. note, when given, replaces
-- the endpoint's note. An endpoint already disabled stays as it is (but
-- for the note) and it returns false. It runs with its owner's rights:
-- the operator writes no column of endpoints itself.
CREATE OR REPLACE FUNCTION {{.schema}}.disable_endpoint(
    endpoint text, note text DEFAULT NULL,
    event_kind text DEFAULT NULL, event_queue text DEFAULT NULL, event_payload jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    e {{.schema}}.endpoints;
BEGIN
    PERFORM {{.schema}}.check_endpoint(disable_endpoint.endpoint);
    INSERT INTO {{.schema}}.endpoints AS x (endpoint) VALUES (disable_endpoint.endpoint) ON CONFLICT (endpoint) DO NOTHING;
    SELECT * INTO e FROM {{.schema}}.endpoints x WHERE x.endpoint = disable_endpoint.endpoint FOR UPDATE;
    UPDATE {{.schema}}.endpoints x
    SET note = coalesce(nullif(disable_endpoint.note, ''), x.note),
        disabled_at = coalesce(x.disabled_at, now()), disabled_by = coalesce(x.disabled_by, 'operator'),
        probe_until = CASE WHEN x.disabled_at IS NULL THEN NULL ELSE x.probe_until END,
        state = CASE WHEN x.disabled_at IS NULL AND x.state = 'half_open' THEN 'open' ELSE x.state END,
        updated_at = now()
    WHERE x.endpoint = e.endpoint;
    IF e.disabled_at IS NOT NULL THEN
        RETURN false;
    END IF;
    PERFORM {{.schema}}.endpoint_event(e.endpoint, 'disabled', 'operator', e.reason, nullif(disable_endpoint.note, ''),
                                       event_kind, event_queue, event_payload);
    RETURN true;
END
$$;

-- enable_endpoint enables a disabled endpoint and closes its circuit: its
-- new jobs go, and its dead ones wait for jobs retry. It returns false when
-- the endpoint was not disabled, and changes nothing then.
CREATE OR REPLACE FUNCTION {{.schema}}.enable_endpoint(
    endpoint text, event_kind text DEFAULT NULL, event_queue text DEFAULT NULL, event_payload jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    e {{.schema}}.endpoints;
BEGIN
    PERFORM {{.schema}}.check_endpoint(enable_endpoint.endpoint);
    UPDATE {{.schema}}.endpoints x
    SET disabled_at = NULL, disabled_by = NULL, state = 'closed', attempts = 0, failures = 0,
        window_started_at = now(), opened_at = NULL, open_until = NULL, cool_down = NULL, probe_until = NULL,
        updated_at = now()
    WHERE x.endpoint = enable_endpoint.endpoint AND x.disabled_at IS NOT NULL
    RETURNING * INTO e;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM {{.schema}}.endpoint_event(e.endpoint, 'enabled', 'operator', NULL, e.note, event_kind, event_queue, event_payload);
    RETURN true;
END
$$;

-- set_endpoint_note sets endpoint's note; NULL or '' clears it. An
-- endpoint with a note stays in the table however long it is unused.
CREATE OR REPLACE FUNCTION {{.schema}}.set_endpoint_note(endpoint text, note text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM {{.schema}}.check_endpoint(set_endpoint_note.endpoint);
    INSERT INTO {{.schema}}.endpoints AS x (endpoint, note)
    VALUES (set_endpoint_note.endpoint, nullif(set_endpoint_note.note, ''))
    ON CONFLICT (endpoint) DO UPDATE SET note = excluded.note, updated_at = now();
    PERFORM pg_catalog.pg_notify('pgdispatch.control',
        pg_catalog.jsonb_build_object('schema', {{.schema_literal}}, 'endpoints', true, 'endpoint', set_endpoint_note.endpoint)::text);
END
$$;

REVOKE ALL ON FUNCTION {{.schema}}.disable_endpoint(text, text, text, text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION {{.schema}}.enable_endpoint(text, text, text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION {{.schema}}.set_endpoint_note(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {{.schema}}.check_endpoint(text) FROM PUBLIC;

-- The roles of docs/roles.sql keep working without running it again: the
-- operator (a role that may read the endpoints and pause queues) reads the
-- events and disables, enables and notes endpoints; the worker (a role
-- that keeps the endpoints) records and reports the events.
DO $$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee))
        FROM pg_catalog.pg_proc p
        JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace,
             pg_catalog.aclexplode(p.proacl) a
        WHERE n.nspname = {{.schema_literal}} AND p.proname = 'pause_queue' AND a.privilege_type = 'EXECUTE'
          AND a.grantee <> p.proowner AND a.grantee <> 0
        ORDER BY 1
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT ON %I.endpoint_events TO %s', {{.schema_literal}}, grantee);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %1$I.disable_endpoint(text, text, text, text, jsonb), '
                                  '%1$I.enable_endpoint(text, text, text, jsonb), %1$I.set_endpoint_note(text, text) TO %2$s',
                                  {{.schema_literal}}, grantee);
    END LOOP;
    FOR grantee IN
        SELECT DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee))
        FROM pg_catalog.pg_class c
        JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace,
             pg_catalog.aclexplode(c.relacl) a
        WHERE n.nspname = {{.schema_literal}} AND c.relname = 'endpoints' AND a.privilege_type = 'UPDATE'
          AND a.grantee <> c.relowner AND a.grantee <> 0
        ORDER BY 1
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT, UPDATE (reported_at), DELETE ON %I.endpoint_events TO %s', {{.schema_literal}}, grantee);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %1$I.endpoint_event(text, text, text, text, text, text, text, jsonb), '
                                  '%1$I.record_endpoint_outcomes(text[], integer[], integer[], text[], interval, integer, '
                                  'float8, interval, text, text, jsonb) TO %2$s', {{.schema_literal}}, grantee);
    END LOOP;
END
$$;
