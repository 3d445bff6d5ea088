-- The jobs table, its indexes and enqueue().
-- {{.schema}} is the schema identifier, already quoted by the migrator.

CREATE TABLE {{.schema}}.jobs (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue        text        NOT NULL DEFAULT 'default',
    kind         text        NOT NULL,
    payload      jsonb       NOT NULL DEFAULT '{}',
    priority     smallint    NOT NULL DEFAULT 0,
    run_at       timestamptz NOT NULL DEFAULT now(),
    status       text        NOT NULL DEFAULT 'pending',
    attempts     integer     NOT NULL DEFAULT 0,
    max_attempts integer,
    dedup_key    text,
    last_error   text,
    locked_by    text,
    locked_until timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    CONSTRAINT jobs_status_check CHECK (status IN ('pending', 'running', 'done', 'dead', 'cancelled')),
    CONSTRAINT jobs_kind_check CHECK (kind <> ''),
    CONSTRAINT jobs_queue_check CHECK (queue <> ''),
    CONSTRAINT jobs_attempts_check CHECK (attempts >= 0),
    CONSTRAINT jobs_max_attempts_check CHECK (max_attempts IS NULL OR max_attempts > 0)
);

COMMENT ON COLUMN {{.schema}}.jobs.max_attempts IS
    'attempts allowed; NULL takes the worker''s MAX_ATTEMPTS (default 5) at the first claim';

-- The claim: due pending rows of a queue in (priority, run_at, id) order.
CREATE INDEX jobs_claim_idx ON {{.schema}}.jobs (queue, priority, run_at, id)
    WHERE status = 'pending';

-- The next scheduled run of a queue, read when a claim comes up short.
CREATE INDEX jobs_schedule_idx ON {{.schema}}.jobs (queue, run_at)
    WHERE status = 'pending';

-- Leases the sweeper gives back.
CREATE INDEX jobs_lease_idx ON {{.schema}}.jobs (locked_until)
    WHERE status = 'running';

-- Finished rows the sweeper purges.
CREATE INDEX jobs_finished_idx ON {{.schema}}.jobs (status, finished_at)
    WHERE finished_at IS NOT NULL;

-- Idempotent enqueue: a key is unique while its row exists.
CREATE UNIQUE INDEX jobs_dedup_key_idx ON {{.schema}}.jobs (dedup_key)
    WHERE dedup_key IS NOT NULL;

-- enqueue inserts a job and returns its id. On a dedup_key conflict it
-- returns the id of the job that holds the key.
CREATE FUNCTION {{.schema}}.enqueue(
    kind         text,
    payload      jsonb       DEFAULT '{}',
    queue        text        DEFAULT 'default',
    run_at       timestamptz DEFAULT now(),
    priority     smallint    DEFAULT 0,
    dedup_key    text        DEFAULT NULL,
    max_attempts integer     DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    job_id bigint;
BEGIN
    LOOP
        INSERT INTO {{.schema}}.jobs AS j (kind, payload, queue, run_at, priority, dedup_key, max_attempts)
        VALUES (enqueue.kind, coalesce(enqueue.payload, '{}'), coalesce(enqueue.queue, 'default'),
                coalesce(enqueue.run_at, now()), coalesce(enqueue.priority, 0), enqueue.dedup_key,
                enqueue.max_attempts)
        ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
        RETURNING j.id INTO job_id;
        IF job_id IS NOT NULL THEN
            RETURN job_id;
        END IF;

        SELECT j.id INTO job_id FROM {{.schema}}.jobs j WHERE j.dedup_key = enqueue.dedup_key;
        IF job_id IS NOT NULL THEN
            RETURN job_id;
        END IF;
        -- The holder of the key was deleted between the two statements: try again.
    END LOOP;
END
$$;

