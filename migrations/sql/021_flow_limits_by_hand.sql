-- queues.limited follows flow_limits however its rows are written: by
-- set_flow_limit and clear_flow_limit, or by hand (INSERT, UPDATE,
-- DELETE, TRUNCATE), and each write wakes the workers of the queues it
-- touched, as the functions do. {{.schema}} is the schema identifier and
-- {{.schema_literal}} its name as a string literal.
--
-- One function for the four statement triggers: a trigger with transition
-- tables fires on one event only. It locks the queues' rows in name order,
-- made where missing, and sets limited to whether the queue has a row of
-- flow_limits now: after the lock, so that of two transactions that write
-- one queue's limits at once, the later to take it sees the earlier's rows.
-- It runs as the schema's owner: a role that may write flow_limits may not
-- write queues, and the trigger writes only what the table says.
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
    UPDATE {{.schema}}.queues q SET limited = l.has, updated_at = now()
    FROM (SELECT n.name, EXISTS (SELECT FROM {{.schema}}.flow_limits f WHERE f.queue = n.name) AS has
          FROM pg_catalog.unnest(names) n(name)) l
    WHERE q.name = l.name AND q.limited IS DISTINCT FROM l.has;
    PERFORM pg_catalog.pg_notify({{.schema_literal}}, n.name) FROM pg_catalog.unnest(names) n(name);
    RETURN NULL;
END
$$;

REVOKE ALL ON FUNCTION {{.schema}}.flow_limits_changed() FROM PUBLIC;

DROP TRIGGER IF EXISTS flow_limits_inserted ON {{.schema}}.flow_limits;
DROP TRIGGER IF EXISTS flow_limits_updated ON {{.schema}}.flow_limits;
DROP TRIGGER IF EXISTS flow_limits_deleted ON {{.schema}}.flow_limits;
DROP TRIGGER IF EXISTS flow_limits_truncated ON {{.schema}}.flow_limits;
CREATE TRIGGER flow_limits_inserted AFTER INSERT ON {{.schema}}.flow_limits
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {{.schema}}.flow_limits_changed();
CREATE TRIGGER flow_limits_updated AFTER UPDATE ON {{.schema}}.flow_limits
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {{.schema}}.flow_limits_changed();
CREATE TRIGGER flow_limits_deleted AFTER DELETE ON {{.schema}}.flow_limits
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION {{.schema}}.flow_limits_changed();
CREATE TRIGGER flow_limits_truncated AFTER TRUNCATE ON {{.schema}}.flow_limits
    FOR EACH STATEMENT EXECUTE FUNCTION {{.schema}}.flow_limits_changed();

-- The queues whose limits were written by hand before this migration.
INSERT INTO {{.schema}}.queues (name)
SELECT DISTINCT f.queue FROM {{.schema}}.flow_limits f ORDER BY 1
ON CONFLICT (name) DO NOTHING;
WITH l AS (
    SELECT q.name, EXISTS (SELECT FROM {{.schema}}.flow_limits f WHERE f.queue = q.name) AS has
    FROM {{.schema}}.queues q ORDER BY q.name FOR UPDATE
)
UPDATE {{.schema}}.queues q SET limited = l.has, updated_at = now()
FROM l WHERE q.name = l.name AND q.limited IS DISTINCT FROM l.has;
