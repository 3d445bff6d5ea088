-- Pending jobs of a kind in run_at order, for the console's job list
-- (admin.Page, docs/console.md, "The job list on a large table"): a kind's
-- page across every queue merges a page of each of its queues, each read in
-- order from here, and a kind and queue together are one range of it. Only
-- pending rows are in it: an insert adds an entry, a claim (the row no
-- longer pending) none. {{.schema}} is the schema identifier.
--
-- Building it reads the table and holds off writers (a SHARE lock) until
-- the migration commits: about a second for 1,000,000 rows on a 2-core
-- machine. On a large table, build it first without holding them off, and
-- the migration finds it:
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_kind_idx
--       ON pgdispatch.jobs (kind, queue, run_at, id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS jobs_kind_idx ON {{.schema}}.jobs (kind, queue, run_at, id)
    WHERE status = 'pending';
