-- A cool-down kept by the probe that closed an endpoint (migration 022)
-- opens it within the opening worker's settings: at least its
-- HTTP_BREAKER_COOL_DOWN, at most its HTTP_BREAKER_MAX_COOL_DOWN. The
-- kept one was the closing worker's: workers of other settings sharing
-- the table (a change of the settings rolling out) opened for two minutes
-- with a cool-down of an hour, or for hours with a longest of minutes.
-- {{.schema}} is the schema identifier and {{.schema_literal}} its name as
-- a string literal.
--
-- record_endpoint_outcomes takes the opener's longest, max_cool_down (NULL:
-- none but the kept one's own bound), after migration 020's arguments.
CREATE OR REPLACE FUNCTION {{.schema}}.record_endpoint_outcomes(
    endpoints text[], attempts integer[], failures integer[], reasons text[],
    win interval, min_attempts integer, fail_ratio float8, cool_down interval,
    event_kind text, event_queue text, event_payload jsonb, max_cool_down interval)
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
            IF e.cool_down_kept_until > now() AND e.cool_down IS NOT NULL THEN
                e.cool_down := least(greatest(e.cool_down, record_endpoint_outcomes.cool_down),
                                     coalesce(greatest(max_cool_down, record_endpoint_outcomes.cool_down), e.cool_down));
            ELSE
                e.cool_down := record_endpoint_outcomes.cool_down;
            END IF;
            e.cool_down_kept_until := NULL;
            e.open_until := now() + e.cool_down;
            e.attempts := 0;
            e.failures := 0;
            e.window_started_at := now();
            PERFORM {{.schema}}.endpoint_event(e.endpoint, 'opened', 'breaker', e.reason, NULL,
                                               event_kind, event_queue, event_payload);
            RETURN NEXT e.endpoint;
        END IF;
        UPDATE {{.schema}}.endpoints x
        SET state = e.state, attempts = e.attempts, failures = e.failures, window_started_at = e.window_started_at,
            opened_at = e.opened_at, open_until = e.open_until, cool_down = e.cool_down,
            cool_down_kept_until = e.cool_down_kept_until, reason = e.reason,
            updated_at = now()
        WHERE x.endpoint = e.endpoint;
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION {{.schema}}.record_endpoint_outcomes(text[], integer[], integer[], text[], interval, integer, float8,
    interval, text, text, jsonb, interval) FROM PUBLIC;

-- The form of migration 020, which workers of builds before this one
-- call: the same, with no longest but the kept one's.
CREATE OR REPLACE FUNCTION {{.schema}}.record_endpoint_outcomes(
    endpoints text[], attempts integer[], failures integer[], reasons text[],
    win interval, min_attempts integer, fail_ratio float8, cool_down interval,
    event_kind text, event_queue text, event_payload jsonb)
RETURNS SETOF text
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT {{.schema}}.record_endpoint_outcomes(endpoints, attempts, failures, reasons, win, min_attempts, fail_ratio,
                                                cool_down, event_kind, event_queue, event_payload, NULL)
$$;

-- The roles that may call migration 020's form (the worker of
-- docs/roles.sql) may call this one.
DO $$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee))
        FROM pg_catalog.pg_proc p
        JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace,
             pg_catalog.aclexplode(p.proacl) a
        WHERE n.nspname = {{.schema_literal}} AND p.proname = 'record_endpoint_outcomes' AND p.pronargs = 11
          AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0
        ORDER BY 1
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %I.record_endpoint_outcomes(text[], integer[], integer[], text[], '
                                  'interval, integer, float8, interval, text, text, jsonb, interval) TO %s',
                                  {{.schema_literal}}, grantee);
    END LOOP;
END
$$;
