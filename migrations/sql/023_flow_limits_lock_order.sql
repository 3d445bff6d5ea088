-- The writes of flow_limits lock in one order: the limits' rows, then
-- their queues' rows, in name order. {{.schema}} is the schema identifier
-- and {{.schema_literal}} its name as a string literal.
--
-- A write by hand locks the rows it writes before its statement's trigger
-- (flow_limits_changed, migration 021) locks their queues; set_flow_limit
-- and clear_flow_limit (migration 016) locked the queue first, then the
-- row: a hand UPDATE holding a row of the queue and waiting for its queue
-- deadlocked with either function holding the queue and waiting for that
-- row. The functions now write the row first and leave the queue to the
-- trigger.
--
-- The trigger writes each queue's row it locks, changed or not: a
-- transaction of REPEATABLE READ (or SERIALIZABLE) whose snapshot is older
-- than another's committed write of the queue's limits then fails to
-- serialize when it locks the row, rather than set limited from limits it
-- cannot see (a hand DELETE of one key's limit, while another session
-- inserted another key's, left the queue unlimited with a limit).
CREATE OR REPLACE FUNCTION {{.schema}}.flow_limits_changed() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    names text[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT array_agg(DISTINCT n.queue ORDER BY n.queue) INTO names FROM new_rows n;
    ELSIF TG_OP = 'UPDATE' THEN
        SELECT array_agg(DISTINCT x.queue ORDER BY x.queue) INTO names
        FROM (SELECT n.queue FROM new_rows n UNION SELECT o.queue FROM old_rows o) x;
    ELSIF TG_OP = 'DELETE' THEN
        SELECT array_agg(DISTINCT o.queue ORDER BY o.queue) INTO names FROM old_rows o;
    ELSE
        SELECT array_agg(q.name ORDER BY q.name) INTO names FROM {{.schema}}.queues q WHERE q.limited;
    END IF;
    IF names IS NULL THEN
        RETURN NULL;
    END IF;

    INSERT INTO {{.schema}}.queues AS q (name)
    SELECT n.name FROM pg_catalog.unnest(names) n(name) ORDER BY n.name
    ON CONFLICT (name) DO NOTHING;
    PERFORM FROM {{.schema}}.queues q WHERE q.name = ANY(names) ORDER BY q.name FOR UPDATE;
    UPDATE {{.schema}}.queues q
    SET limited = l.has, updated_at = CASE WHEN q.limited IS DISTINCT FROM l.has THEN now() ELSE q.updated_at END
    FROM (SELECT n.name, EXISTS (SELECT FROM {{.schema}}.flow_limits f WHERE f.queue = n.name) AS has
          FROM pg_catalog.unnest(names) n(name)) l
    WHERE q.name = l.name;
    PERFORM pg_catalog.pg_notify({{.schema_literal}}, n.name) FROM pg_catalog.unnest(names) n(name);
    RETURN NULL;
END
$$;

-- set_flow_limit is migration 016's, but it writes the limit's row and
-- leaves the queue's to the trigger, which sets limited and wakes the
-- queue's workers.
CREATE OR REPLACE FUNCTION {{.schema}}.set_flow_limit(
    queue       text,
    key         text     DEFAULT NULL,
    concurrency integer  DEFAULT NULL,
    strict      boolean  DEFAULT false,
    rate        integer  DEFAULT NULL,
    per         interval DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF set_flow_limit.queue IS NULL OR char_length(set_flow_limit.queue) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION 'set_flow_limit: the queue must be a name of 1 to 128 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF char_length(set_flow_limit.key) NOT BETWEEN 1 AND 256 THEN
        RAISE EXCEPTION 'set_flow_limit: the key must be of 1 to 256 characters, or NULL for every key of the queue'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF set_flow_limit.concurrency NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'set_flow_limit: the concurrency must be from 1 to 100000, or NULL for none, not %', set_flow_limit.concurrency
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (set_flow_limit.rate IS NULL) <> (set_flow_limit.per IS NULL) THEN
        RAISE EXCEPTION 'set_flow_limit: a rate needs its interval (per), and an interval its rate'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF set_flow_limit.rate NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'set_flow_limit: the rate must be from 1 to 10000 starts, not %', set_flow_limit.rate
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF set_flow_limit.per <= interval '0' OR set_flow_limit.per > interval '1 day' THEN
        RAISE EXCEPTION 'set_flow_limit: the rate''s interval (per) must be more than 0 and at most 1 day, not %', set_flow_limit.per
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    INSERT INTO {{.schema}}.flow_limits AS l (queue, key, concurrency, strict, rate, per)
    VALUES (set_flow_limit.queue, set_flow_limit.key, set_flow_limit.concurrency,
            coalesce(set_flow_limit.strict, false), set_flow_limit.rate, set_flow_limit.per)
    ON CONFLICT (queue, coalesce(key, ''))
    DO UPDATE SET concurrency = EXCLUDED.concurrency, strict = EXCLUDED.strict, rate = EXCLUDED.rate,
                  per = EXCLUDED.per, updated_at = now();
END
$$;

-- clear_flow_limit is migration 016's, but it deletes the limit's row
-- before it locks the queue's (the trigger locks it when a row went), and
-- then sets limited from the limits it sees after that lock.
CREATE OR REPLACE FUNCTION {{.schema}}.clear_flow_limit(queue text, key text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    removed boolean;
BEGIN
    DELETE FROM {{.schema}}.flow_limits l
    WHERE l.queue = clear_flow_limit.queue AND coalesce(l.key, '') = coalesce(clear_flow_limit.key, '');
    removed := FOUND;
    PERFORM FROM {{.schema}}.queues q WHERE q.name = clear_flow_limit.queue FOR UPDATE;
    IF NOT EXISTS (SELECT FROM {{.schema}}.flow_limits l WHERE l.queue = clear_flow_limit.queue) THEN
        UPDATE {{.schema}}.queues q SET limited = false, updated_at = now()
        WHERE q.name = clear_flow_limit.queue AND q.limited;
    END IF;
    RETURN removed;
END
$$;
