package cursor

import "strings"

// walked is how many of a queue's priorities a claim and a look walk one by
// one, each by its first pending job, due or not, so that jobs ahead at
// thousands of priorities cost them that many index descents, not two
// descents each. Past them, the walk's step is the first due job of a
// later priority, found by a scan in (priority, run_at, id) order that
// passes over the jobs not due (the look's way on); the claim takes the
// due jobs past them in one scan (Walked, PastWalked).
const walked = "16"

// walkFirst is the walk's first job: queue $1's first pending job in
// (priority, run_at, id) order; {first} stands for what else it must meet.
const walkFirst = "(SELECT priority, run_at, id, 1 FROM {jobs}\n" +
	"     WHERE status = 'pending' AND queue = $1{first}\n" +
	"     ORDER BY priority, run_at, id LIMIT 1)\n"

// Walk is the CTE pr(priority, run_at, id, depth) of a WITH RECURSIVE: the
// first pending job of queue $1's first priority, whose WHERE also has
// first, then the first of each next priority, through the first walked,
// and past them the first due job of each next priority that has one,
// read only as far as the statement asks. The step's bound on run_at is an
// index condition either way (infinity while walking: a run_at is finite,
// migration 005), so that the two kinds of step are one scan in the plan.
func Walk(first string) string {
	return "pr(priority, run_at, id, depth) AS (\n    " + strings.Replace(walkFirst, "{first}", first, 1) + `  UNION ALL
    SELECT n.priority, n.run_at, n.id, pr.depth + 1 FROM pr CROSS JOIN LATERAL (
        SELECT j.priority, j.run_at, j.id FROM {jobs} j
        WHERE j.status = 'pending' AND j.queue = $1 AND j.priority > pr.priority
          AND j.run_at <= CASE WHEN pr.depth < ` + walked + ` THEN 'infinity'::timestamptz ELSE now() END
        ORDER BY j.priority, j.run_at, j.id LIMIT 1) n
)`
}

// OnePriority is a scan's condition for the due jobs of the walk's
// priority pr, from its first pending job (read in run_at, id order, it
// ends at the first not due).
const OnePriority = "priority = pr.priority AND (run_at, id) >= (pr.run_at, pr.id) AND run_at <= now()"

// Walked is the walk's first walked priorities, for a claim's scans by
// priority: the claim takes the due jobs past them in one scan
// (PastWalked), which passes over rows another transaction holds locked
// at an index entry each, where a walk's step to each such priority costs
// two index descents.
const Walked = "(SELECT * FROM pr LIMIT " + walked + ") pr"

// PastWalked is a scan's condition for the priorities past the walked
// ones: none when the walk ended before. Its LIMIT stops the walk there.
const PastWalked = "priority > (SELECT priority FROM pr WHERE depth = " + walked + " LIMIT 1)"

// Unpaused is the claim's condition on the walk's first job: its queue
// neither paused nor limited (the claim's CTE p).
const Unpaused = " AND NOT (SELECT paused OR limited FROM p)"
