-- The receivers of http_callback jobs and their circuit breakers
-- (docs/operations.md, "Endpoints and the circuit breaker"). {{.schema}} is
-- the schema identifier and {{.schema_literal}} its name as a string
-- literal.

-- endpoints: one row per receiver that a worker has sent a request to. An
-- endpoint is a URL's scheme, host (lowercased) and port (the scheme's
-- default filled in): https://hooks.example.com:443. Its state is the
-- breaker's:
--   closed     requests go; attempts and failures count the outcomes of
--              the window that began at window_started_at.
--   open       requests wait, pending, until open_until; opened_at is when
--              it opened, reason the last failure seen before.
--   half_open  one probe is in flight until probe_until; the others wait.
-- cool_down is how long it stays open: the worker's setting when it opens
-- from closed, doubled (up to the worker's cap) each time a probe fails.
--
-- Workers write it, and their sweepers delete the endpoints closed and
-- unused for a day; the operator reads it. No one else reads it.
CREATE TABLE IF NOT EXISTS {{.schema}}.endpoints (
    endpoint          text        PRIMARY KEY CONSTRAINT endpoints_endpoint_check CHECK (char_length(endpoint) BETWEEN 1 AND 300),
    state             text        NOT NULL DEFAULT 'closed'
                                  CONSTRAINT endpoints_state_check CHECK (state IN ('closed', 'open', 'half_open')),
    attempts          integer     NOT NULL DEFAULT 0 CONSTRAINT endpoints_attempts_check CHECK (attempts >= 0),
    failures          integer     NOT NULL DEFAULT 0 CONSTRAINT endpoints_failures_check CHECK (failures >= 0),
    window_started_at timestamptz NOT NULL DEFAULT now(),
    opened_at         timestamptz,
    open_until        timestamptz,
    cool_down         interval,
    probe_until       timestamptz,
    reason            text        CONSTRAINT endpoints_reason_check CHECK (char_length(reason) <= 300),
    updated_at        timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE {{.schema}}.endpoints IS
    'the receivers of http_callback jobs and their circuit breakers: closed, open or half_open';
COMMENT ON COLUMN {{.schema}}.endpoints.reason IS
    'the last failure counted before the circuit opened, redacted as last_error is';

REVOKE ALL ON {{.schema}}.endpoints FROM PUBLIC;

-- record_endpoint_outcomes adds the outcomes a worker counted since its
-- last call: for each endpoint (in the order given, which the worker sorts)
-- the attempts, the failures among them and the last failure's text. A
-- window older than win starts again. A closed endpoint whose window holds
-- min_attempts or more with failures at fail_ratio of them or more opens
-- for cool_down. Each endpoint that opens is told on the channel
-- pgdispatch.control. It returns the endpoints that opened.
CREATE OR REPLACE FUNCTION {{.schema}}.record_endpoint_outcomes(
    endpoints text[], attempts integer[], failures integer[], reasons text[],
    win interval, min_attempts integer, fail_ratio float8, cool_down interval)
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
        IF e.state = 'closed' AND e.attempts >= min_attempts AND e.failures >= fail_ratio * e.attempts THEN
            e.state := 'open';
            e.opened_at := now();
            e.cool_down := record_endpoint_outcomes.cool_down;
            e.open_until := now() + record_endpoint_outcomes.cool_down;
            e.attempts := 0;
            e.failures := 0;
            e.window_started_at := now();
            PERFORM pg_catalog.pg_notify('pgdispatch.control',
                pg_catalog.jsonb_build_object('schema', {{.schema_literal}}, 'endpoints', true, 'endpoint', e.endpoint)::text);
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

REVOKE ALL ON FUNCTION {{.schema}}.record_endpoint_outcomes(text[], integer[], integer[], text[], interval, integer, float8, interval) FROM PUBLIC;

-- The roles of docs/roles.sql keep working without running it again: a
-- role that may pause queues (the operator) reads the endpoints; a role
-- that may delete jobs and fire the schedules' slots (the worker) keeps
-- them.
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
        EXECUTE pg_catalog.format('GRANT SELECT ON %I.endpoints TO %s', {{.schema_literal}}, grantee);
    END LOOP;
    FOR grantee IN
        SELECT DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee))
        FROM pg_catalog.pg_class c
        JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace,
             pg_catalog.aclexplode(c.relacl) a
        WHERE n.nspname = {{.schema_literal}} AND c.relname = 'jobs' AND a.privilege_type = 'DELETE'
          AND a.grantee <> c.relowner AND a.grantee <> 0
          AND EXISTS (
              SELECT FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) f
              WHERE p.pronamespace = n.oid AND p.proname = 'fire_schedule_slots'
                AND f.privilege_type = 'EXECUTE' AND f.grantee = a.grantee)
        ORDER BY 1
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I.endpoints TO %s', {{.schema_literal}}, grantee);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %I.record_endpoint_outcomes(text[], integer[], integer[], '
                                  'text[], interval, integer, float8, interval) TO %s', {{.schema_literal}}, grantee);
    END LOOP;
END
$$;
