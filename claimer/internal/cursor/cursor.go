// Package cursor says where a claimer's next claim starts in its queue's
// (priority, run_at, id) order: after the last job of its last full claim,
// or the front.
package cursor

import (
	"strings"
	"time"

	"github.com/pgdispatch/pgdispatch/claimer/internal/machine"
	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
)

// FrontEvery is the longest a claimer claims from its cursor without a
// claim from the front, by the wall clock, however busy it is: counted
// from the end of the last claim from the front, so that a claim from the
// front that takes longer (one that walks millions of dead entries under
// a long hold) still leaves the cursor its second.
const FrontEvery = time.Second

// FrontShare is how many times as long as the last claim from the front
// took a claimer claims from its cursor before the next, when that is
// longer than FrontEvery: claims from the front, however slow a long hold
// makes them, take at most a fifth of a saturated claimer's time.
const FrontShare = 4

// SlowFront is how long the last claim from the front must have taken for
// a claimer to claim from its cursor at all. A claim from the front of an
// ordinary queue takes 1 to 3 ms on a small machine, and then every claim
// is from the front, in strict (priority, run_at, id) order; one that walks
// the dead entries a transaction holding back vacuum keeps alive (0.2 to
// 0.8 µs each) takes 5 ms at about 10,000 of them, and grows with every
// job run since. At 20 ms, a drain under a hold was held to about 100 jobs
// each 15 to 20 ms, its claims from the front just too quick for the cursor.
const SlowFront = 5 * time.Millisecond

// cursorCond bounds a claim to the rows after the cursor ($7, $8, $9) in
// (priority, run_at, id) order: a row comparison that starts the scan of
// jobs_claim_idx (queue, priority, run_at, id) there.
const cursorCond = ` AND (priority, run_at, id) > ($7::smallint, $8::timestamptz, $9::bigint)`

// SQL is the claim statement sql from the cursor: it adds cursorCond to
// the claim's scan and to its count of skipped due rows, so both start
// after the last job of the claimer's last claim. It panics if sql no
// longer reads as it expects.
func SQL(sql string) string {
	for _, where := range []string{
		"WHERE status = 'pending' AND queue = $1 AND run_at <= now() AND NOT (SELECT paused FROM p)\n",
		"WHERE status = 'pending' AND queue = $1 AND run_at <= now()\n",
	} {
		if strings.Count(sql, where) != 1 {
			panic("claimer: the claim statement's scan is not where cursor.SQL looks for it: " + where)
		}
		sql = strings.Replace(sql, where, strings.TrimSuffix(where, "\n")+cursorCond+"\n", 1)
	}
	return sql
}

// Cursor is where the claimer's next claim starts in its queue's
// (priority, run_at, id) order. The claim index, jobs_claim_idx, keeps an
// entry for every pending version of a row until vacuum removes it, and
// while a transaction holds an old snapshot vacuum can remove none: a
// claim from the front of the queue walks, at every claim, over the entries
// of every job claimed since the snapshot was taken (0.2 to 0.8 µs each). A
// claim from the cursor starts after the last job the claimer took, past
// them.
//
// A claimer claims from its cursor only while its last claim from the
// front took SlowFront or longer: then the dead entries cost more than the
// strict order is worth. The cursor is set only by a claim that took every
// slot it asked for (the rows after its last one may hold more), and only
// such a chain of claims claims from it. Every other claim is from the
// front:
//   - the first, and any after a claim that came up short (the range ahead
//     of the cursor is exhausted), failed or found the queue paused, which
//     includes every look of a claimer that is not saturated, and every
//     claim woken by a notification while drowsy or asleep;
//   - the fallback tick's;
//   - the claim after this claimer gave back the jobs of a lost claim;
//   - the first claim at least FrontEvery after the last claim from the
//     front ended (FrontShare times as long as it took, if that is longer),
//     by the wall clock, whatever else happened meanwhile.
//
// So a row that becomes due behind the cursor (a higher priority than the
// last job taken, an earlier run_at, a lost claim's job given back, a row
// that was locked when the claim passed it) waits until the next claim
// from the front: at once when the claimer is not saturated, and when it
// is, until its first claim FrontEvery (or FrontShare times the last claim
// from the front's time) after the last. A saturated claimer claims as
// slots free: the jobs it takes from the cursor meanwhile keep their slots
// while they run, and long ones make that wait longer.
type Cursor struct {
	Set       bool // else the next claim is from the front
	Priority  int16
	RunAt     time.Time
	ID        int64
	LastFront time.Time        // when the last claim from the front ended
	FrontTook time.Duration    // how long it took
	Slow      time.Duration    // SlowFront, but in tests (negative: every claim from the front is slow); 0: SlowFront
	Every     time.Duration    // FrontEvery, but in tests; 0: FrontEvery
	Now       func() time.Time // time.Now, but in tests; nil: time.Now
}

// Clock is the time now.
func (k *Cursor) Clock() time.Time {
	if k.Now != nil {
		return k.Now()
	}
	return time.Now()
}

// FromFront reports whether the claim that ev starts at now is from the
// front. The claimer calls FrontEnded when such a claim has ended.
func (k *Cursor) FromFront(ev machine.Event, now time.Time) bool {
	every := k.Every
	if every == 0 {
		every = FrontEvery
	}
	slow := k.Slow
	if slow == 0 {
		slow = SlowFront
	}
	return !k.Set || ev == machine.EventTick || k.FrontTook < slow ||
		now.Sub(k.LastFront) >= max(every, FrontShare*k.FrontTook)
}

// FrontEnded notes that a claim from the front sent at sent ended at now,
// whether or not it succeeded.
func (k *Cursor) FrontEnded(sent, now time.Time) { k.LastFront, k.FrontTook = now, now.Sub(sent) }

// Reset makes the next claim from the front.
func (k *Cursor) Reset() { k.Set = false }

// Claimed moves the cursor after a claim that asked for limit jobs and
// took runs: to the last of them in (priority, run_at, id) order when it
// took limit, else nowhere.
func (k *Cursor) Claimed(limit int, runs []*runstate.Run) {
	if len(runs) < limit || len(runs) == 0 {
		k.Set = false
		return
	}
	k.Set = false
	for _, r := range runs {
		j := r.Job
		if !k.Set || after(j.Priority, j.RunAt, j.ID, k.Priority, k.RunAt, k.ID) {
			k.Set, k.Priority, k.RunAt, k.ID = true, j.Priority, j.RunAt, j.ID
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
