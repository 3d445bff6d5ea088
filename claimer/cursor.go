package claimer

import (
	"strings"
	"time"

	"github.com/pgdispatch/pgdispatch/claimer/internal/machine"
	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
)

// frontEvery is the longest a claimer claims from its cursor without a
// claim from the front, by the wall clock, however busy it is.
const frontEvery = time.Second

// cursorCond bounds a claim to the rows after the cursor ($7, $8, $9) in
// (priority, run_at, id) order: a row comparison that starts the scan of
// jobs_claim_idx (queue, priority, run_at, id) there.
const cursorCond = ` AND (priority, run_at, id) > ($7::smallint, $8::timestamptz, $9::bigint)`

// claimCursorSQL is claimSQL from the cursor: the claim and its count of
// skipped due rows start after the last job of the claimer's last claim.
var claimCursorSQL = cursorSQL(claimSQL)

// cursorSQL adds cursorCond to the claim's scan and to its count of
// skipped rows, and panics if claimSQL no longer reads as it expects.
func cursorSQL(sql string) string {
	for _, where := range []string{
		"WHERE status = 'pending' AND queue = $1 AND run_at <= now() AND NOT (SELECT paused FROM p)\n",
		"WHERE status = 'pending' AND queue = $1 AND run_at <= now()\n",
	} {
		if strings.Count(sql, where) != 1 {
			panic("claimer: the claim statement's scan is not where cursorSQL looks for it: " + where)
		}
		sql = strings.Replace(sql, where, strings.TrimSuffix(where, "\n")+cursorCond+"\n", 1)
	}
	return sql
}

// cursor is where the claimer's next claim starts in its queue's
// (priority, run_at, id) order. The claim index, jobs_claim_idx, keeps an
// entry for every pending version of a row until vacuum removes it, and
// while a transaction holds an old snapshot vacuum can remove none: a
// claim from the front of the queue walks, at every claim, over the entries
// of every job claimed since the snapshot was taken (0.2 to 0.8 µs each). A
// claim from the cursor starts after the last job the claimer took, past
// them.
//
// The cursor is set only by a claim that took every slot it asked for (the
// rows after its last one may hold more), and only such a chain of claims
// claims from it. Every other claim is from the front:
//   - the first, and any after a claim that came up short (the range ahead
//     of the cursor is exhausted), failed or found the queue paused, which
//     includes every look of a claimer that is not saturated, and every
//     claim woken by a notification while drowsy or asleep;
//   - the fallback tick's;
//   - the claim after this claimer gave back the jobs of a lost claim;
//   - the first claim at least frontEvery after the last claim from the
//     front, by the wall clock, whatever else happened meanwhile.
//
// So a row that becomes due behind the cursor (a higher priority than the
// last job taken, an earlier run_at, a lease the sweeper gave back, a job
// released by another worker's shutdown, a row that was locked when the
// claim passed it) waits at most until the next claim from the front:
// at once when the claimer is not saturated, within about frontEvery and a
// claim's time when it is.
type cursor struct {
	set       bool
	priority  int16
	runAt     time.Time
	id        int64
	lastFront time.Time        // when the last claim from the front was sent
	every     time.Duration    // frontEvery, but in tests; 0: frontEvery
	now       func() time.Time // time.Now, but in tests; nil: time.Now
}

// clock is the time now.
func (k *cursor) clock() time.Time {
	if k.now != nil {
		return k.now()
	}
	return time.Now()
}

// fromFront reports whether the claim that ev starts at now is from the
// front, and notes when it is.
func (k *cursor) fromFront(ev machine.Event, now time.Time) bool {
	every := k.every
	if every == 0 {
		every = frontEvery
	}
	if !k.set || ev == machine.EventTick || now.Sub(k.lastFront) >= every {
		k.lastFront = now
		return true
	}
	return false
}

// reset makes the next claim from the front.
func (k *cursor) reset() { k.set = false }

// claimed moves the cursor after a claim that asked for limit jobs and
// took runs: to the last of them in (priority, run_at, id) order when it
// took limit, else nowhere.
func (k *cursor) claimed(limit int, runs []*runstate.Run) {
	if len(runs) < limit || len(runs) == 0 {
		k.set = false
		return
	}
	k.set = false
	for _, r := range runs {
		j := r.Job
		if !k.set || after(j.Priority, j.RunAt, j.ID, k.priority, k.runAt, k.id) {
			k.set, k.priority, k.runAt, k.id = true, j.Priority, j.RunAt, j.ID
		}
	}
}

// after reports whether (p, t, id) comes after (p2, t2, id2).
func after(p int16, t time.Time, id int64, p2 int16, t2 time.Time, id2 int64) bool {
	switch {
	case p != p2:
		return p > p2
	case !t.Equal(t2):
		return t.After(t2)
	}
	return id > id2
}
