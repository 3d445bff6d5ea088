-- The secrets that sign http_callback requests (docs/operations.md,
-- "Rotating the signing secret"). {{.schema}} is the schema identifier and
-- {{.schema_literal}} its name as a string literal.

-- signing_secrets: every secret in force signs each request, the newest
-- first; a secret is in force until expires_at (NULL: until a rotation
-- sets it). A rotation adds a secret and ends the others' after an
-- overlap. The secrets are for every receiver; a secret for one endpoint
-- will be a row with a column naming it.
--
-- The worker reads the secrets; the operator rotates them and reads every
-- column but secret. No one else reads the table.
CREATE TABLE IF NOT EXISTS {{.schema}}.signing_secrets (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    secret     bytea       NOT NULL CONSTRAINT signing_secrets_secret_check CHECK (octet_length(secret) BETWEEN 16 AND 64),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz,
    CONSTRAINT signing_secrets_expires_at_check CHECK (expires_at >= created_at)
);

COMMENT ON TABLE {{.schema}}.signing_secrets IS
    'the secrets that sign http_callback requests: every secret in force signs, the newest first';
COMMENT ON COLUMN {{.schema}}.signing_secrets.expires_at IS
    'when the secret stops signing; NULL: it signs until a rotation sets this';

REVOKE ALL ON {{.schema}}.signing_secrets FROM PUBLIC;

-- rotate_signing_secret adds secret, which signs from now on, and ends
-- every other secret in force after overlap (from now; 0: at once): until
-- then, they sign too. A secret that ends sooner keeps its end. The
-- secrets that ended are deleted. Workers are told on the channel
-- pgdispatch.control and sign with the new secret from their next request
-- on. It returns the new secret's id and when the last of the others
-- stops signing (NULL: none signs). Two rotations at once take turns.
CREATE OR REPLACE FUNCTION {{.schema}}.rotate_signing_secret(secret bytea, overlap interval)
RETURNS TABLE (id bigint, others_expire_at timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    new_id bigint;
    t      timestamptz;
    ends   timestamptz;
BEGIN
    IF overlap IS NULL OR overlap < interval '0' THEN
        RAISE EXCEPTION 'rotate_signing_secret: the overlap must be zero or more, not %', overlap
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext({{.schema_literal}} || '.signing_secrets'));
    -- The time once the lock is held, not the transaction's start: a
    -- rotation that committed while this one waited made its secret
    -- after this transaction began, and an end is never before a
    -- secret was made (nor is a secret deleted before it ends).
    t := pg_catalog.clock_timestamp();
    ends := t + overlap;
    PERFORM FROM {{.schema}}.signing_secrets s ORDER BY s.id FOR UPDATE;
    DELETE FROM {{.schema}}.signing_secrets s WHERE s.expires_at <= t;
    UPDATE {{.schema}}.signing_secrets s SET expires_at = greatest(ends, s.created_at)
    WHERE s.expires_at IS NULL OR s.expires_at > ends;
    SELECT max(s.expires_at) INTO ends FROM {{.schema}}.signing_secrets s WHERE s.expires_at > t;
    INSERT INTO {{.schema}}.signing_secrets AS s (secret) VALUES (rotate_signing_secret.secret)
    RETURNING s.id INTO new_id;
    PERFORM pg_catalog.pg_notify('pgdispatch.control',
        pg_catalog.jsonb_build_object('schema', {{.schema_literal}}, 'secrets', true)::text);
    RETURN QUERY SELECT new_id, ends;
END
$$;

REVOKE ALL ON FUNCTION {{.schema}}.rotate_signing_secret(bytea, interval) FROM PUBLIC;

-- The roles of docs/roles.sql keep working without running it again: a
-- role that may pause queues (the operator) may rotate the secrets and
-- read every column but secret; a role that may delete jobs and fire the
-- schedules' slots (the worker; the console's role or a purge may delete
-- jobs too, but fires nothing) reads the secrets.
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
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %I.rotate_signing_secret(bytea, interval) TO %s',
                                  {{.schema_literal}}, grantee);
        EXECUTE pg_catalog.format('GRANT SELECT (id, created_at, expires_at), INSERT (secret), UPDATE (expires_at), DELETE '
                                  'ON %I.signing_secrets TO %s', {{.schema_literal}}, grantee);
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
        EXECUTE pg_catalog.format('GRANT SELECT ON %I.signing_secrets TO %s', {{.schema_literal}}, grantee);
    END LOOP;
END
$$;
