-- Pending jobs of a kind in run_at order, for the console's job list
-- (admin.Page, docs/console.md, "The job list on a large table"): a page of
-- a kind across every queue merges a page of each of its queues, each read
-- in order from here, and a kind and a queue together are one range of it.
-- Only pending rows are in it: an insert of a pending job adds an entry, a
-- claim (the row no longer pending) none. {{.schema}} is the schema
-- identifier and {{.schema_literal}} its name as a string literal.
--
-- Building it reads the table and holds off writers and claims (a SHARE
-- lock) until the migration commits (docs/operations.md, "Installing the
-- schema"). On a large table, build it first without holding them off,
-- and the migration keeps it:
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_kind_idx
--       ON pgdispatch.jobs (kind, queue, run_at, id) WHERE status = 'pending';
-- A concurrent build that failed leaves the index invalid: it is built
-- again here.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_index
               WHERE indexrelid = pg_catalog.to_regclass(pg_catalog.quote_ident({{.schema_literal}}) || '.jobs_kind_idx')
                 AND NOT indisvalid) THEN
        DROP INDEX {{.schema}}.jobs_kind_idx;
    END IF;
END $$;

CREATE INDEX IF NOT EXISTS jobs_kind_idx ON {{.schema}}.jobs (kind, queue, run_at, id)
    WHERE status = 'pending';
