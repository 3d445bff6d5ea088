-- An endpoint that fails again soon after a probe closed it opens for
-- longer each time, as a probe that fails makes it wait longer: a receiver
-- that answers the probe but fails under its backlog would otherwise open
-- and close every cool-down (30 s), each time an event, an operator's
-- notification job, and a release of its backlog, whose attempts it fails.
-- {{.schema}} is the schema identifier and {{.schema_literal}} its name as
-- a string literal.
--
-- The worker that closes an endpoint keeps its cool-down, doubled up to its
-- HTTP_BREAKER_MAX_COOL_DOWN, until that long after the close
-- (cool_down_kept_until). An endpoint that opens from closed before then
-- opens for the kept cool-down; after, for the worker's
-- HTTP_BREAKER_COOL_DOWN, as before. While it is closed, cool_down is the
-- kept one.
ALTER TABLE {{.schema}}.endpoints ADD COLUMN IF NOT EXISTS cool_down_kept_until timestamptz;

COMMENT ON COLUMN {{.schema}}.endpoints.cool_down_kept_until IS
    'while closed: until when an opening takes cool_down (twice the last, kept by the probe that closed it) rather than the worker''s HTTP_BREAKER_COOL_DOWN';

-- record_endpoint_outcomes, as in migration 020, but an endpoint that opens
-- before its cool_down_kept_until opens for its kept cool_down.
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
            IF NOT (e.cool_down_kept_until > now() AND e.cool_down IS NOT NULL) THEN
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
    interval, text, text, jsonb) FROM PUBLIC;
