-- Placeholder for another branch's migration 14: drop this commit when merging.
SELECT 1;
