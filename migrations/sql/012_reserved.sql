-- Reserved for the migration another branch adds as 012: this file only
-- keeps the numbers contiguous on this branch, and goes at the merge.
SELECT 1;
