-- A dedup key's holder is compared only for the role that created it.
-- {{.schema}} is the schema identifier and {{.schema_literal}} its name as a
-- string literal.

-- created_by: the role that logged in (session_user) when the row was
-- inserted, whatever the statement: a plain INSERT, enqueue(), a dispatch
-- trigger or a schedule. Rows from before this column have none. Adding a
-- column without a default rewrites nothing; the default applies to rows
-- inserted from now on. docs/roles.sql grants no writer INSERT on it.
ALTER TABLE {{.schema}}.jobs ADD COLUMN IF NOT EXISTS created_by oid;
ALTER TABLE {{.schema}}.jobs ALTER COLUMN created_by SET DEFAULT pg_catalog.to_regrole(pg_catalog.quote_ident(session_user))::oid;

COMMENT ON COLUMN {{.schema}}.jobs.created_by IS
    'the role that logged in when the row was inserted (session_user), as its oid: enqueue_checked compares the job holding a dedup_key only for that role';

-- enqueue_checked inserts a job as enqueue does, and says what happened:
-- created is false when a job already held dedup_key (id is then that
-- job's), and conflict is true when that job is not the one asked for.
--
-- It runs with its owner's rights (SECURITY DEFINER), so that a role
-- allowed only to enqueue (docs/roles.sql) need not read the table. It
-- tells a caller nothing of a job the caller did not create: the holder is
-- compared with the job asked for (kind, queue, payload, priority,
-- max_attempts when one is given, and a run_at later than asked while the
-- job has not run) only when the role the caller logged in as created it,
-- or may read the table. Any other holder is a conflict whatever it holds,
-- so that a writer can neither confirm a guessed payload nor find a
-- job's run_at by bisection; it learns the holder's id, and that the key
-- is taken, which its own INSERT would tell it too. A function running
-- with its owner's rights knows its caller by session_user, the role that
-- logged in: a SET ROLE changes current_user, not session_user, and a
-- session may SET ROLE only to roles it is a member of.
--
-- pgdispatch.firing is off while it runs, as in migration 012, so that a
-- writer who sets it cannot write a schedule's key through the owner's
-- rights.
--
-- A conflict also raises a NOTICE, which plain enqueue() callers see; it
-- names the fields that differ only when the holder was compared. The
-- search_path is pinned and every name qualified, so the caller's objects
-- are never looked up.
CREATE OR REPLACE FUNCTION {{.schema}}.enqueue_checked(
    kind         text,
    payload      jsonb       DEFAULT '{}',
    queue        text        DEFAULT 'default',
    run_at       timestamptz DEFAULT now(),
    priority     smallint    DEFAULT 0,
    dedup_key    text        DEFAULT NULL,
    max_attempts integer     DEFAULT NULL,
    OUT id       bigint,
    OUT created  boolean,
    OUT conflict boolean
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET pgdispatch.firing = 'off'
AS $$
#variable_conflict use_column
DECLARE
    want_payload  jsonb       := coalesce(enqueue_checked.payload, '{}');
    want_queue    text        := coalesce(enqueue_checked.queue, 'default');
    want_run_at   timestamptz := coalesce(enqueue_checked.run_at, now());
    want_priority smallint    := coalesce(enqueue_checked.priority, 0);
    caller        oid;
    holder_by     oid;
    differs       text;
BEGIN
    LOOP
        INSERT INTO {{.schema}}.jobs AS j (kind, payload, queue, run_at, priority, dedup_key, max_attempts)
        VALUES (enqueue_checked.kind, want_payload, want_queue, want_run_at, want_priority,
                enqueue_checked.dedup_key, enqueue_checked.max_attempts)
        ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
        RETURNING j.id INTO id;
        IF id IS NOT NULL THEN
            created := true;
            conflict := false;
            RETURN;
        END IF;

        caller := to_regrole(quote_ident(session_user))::oid;
        SELECT j.id, j.created_by,
               concat_ws(', ',
                   CASE WHEN j.kind IS DISTINCT FROM enqueue_checked.kind THEN 'kind' END,
                   CASE WHEN j.queue IS DISTINCT FROM want_queue THEN 'queue' END,
                   CASE WHEN j.payload IS DISTINCT FROM want_payload THEN 'payload' END,
                   CASE WHEN j.priority IS DISTINCT FROM want_priority THEN 'priority' END,
                   CASE WHEN enqueue_checked.max_attempts IS NOT NULL
                             AND j.max_attempts IS DISTINCT FROM enqueue_checked.max_attempts THEN 'max_attempts' END,
                   CASE WHEN j.attempts = 0 AND j.run_at > want_run_at THEN 'a later run_at' END)
        INTO id, holder_by, differs
        FROM {{.schema}}.jobs j
        WHERE j.dedup_key = enqueue_checked.dedup_key;
        IF id IS NOT NULL THEN
            created := false;
            IF holder_by = caller OR has_table_privilege(session_user, format('%I.jobs', {{.schema_literal}}), 'SELECT') THEN
                conflict := differs <> '';
                IF conflict THEN
                    RAISE NOTICE 'pgdispatch: dedup_key % is held by job %, which differs from the job asked for (%); no job was created',
                        enqueue_checked.dedup_key, id, differs
                        USING HINT = 'Another writer may have taken the key first. Look at that job: pgdispatch jobs show '
                                     || id || '.';
                END IF;
            ELSE
                conflict := true;
                RAISE NOTICE 'pgdispatch: dedup_key % is held by job %, which another role created; no job was created',
                    enqueue_checked.dedup_key, id
                    USING HINT = 'Another writer may have taken the key first. A role that may read pgdispatch''s jobs can look at it: pgdispatch jobs show '
                                 || id || '.';
            END IF;
            RETURN;
        END IF;
        -- The holder of the key was deleted between the two statements: try again.
    END LOOP;
END
$$;
