// Package cursor says where a claimer's next claim starts in its queue's
// (priority, run_at, id) order, after the last job it took or at the front,
// and looks from the front beside the claims for the jobs behind it.
package cursor

import (
	"cmp"
	"math"
	"strings"
	"time"

	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
)

// HeldClaim is how long a claim from the front that came up short must
// take the server for every next claim to come from the cursor (the front
// is held: a hold on vacuum), until a look from the front finds it quick;
// such a claim asks for one. A claim that walks the dead entries a
// transaction holding back vacuum keeps alive (0.2 to 0.8 µs each) takes
// 5 ms at about 10,000 of them, and grows with every job run since; a lone
// job's claim takes the server 0.1 to 0.3 ms. A full claim's time is its
// writes' too (1,000 jobs took 5.5 ms on a vacuumed table): a slow full
// claim makes the front busy, and the look it asks for tells whether it
// is held. At 20 ms, a drain under a hold was held to about 100 jobs each
// 15 to 20 ms, its claims from the front just too quick for the cursor.
const HeldClaim = 5 * time.Millisecond

// BusyClaim is how long a claim from the front must take the server for
// the claims that follow a full claim (the claimer is saturated) to come
// from the cursor, until a look says the front is quick; such a claim asks
// for one. Without a hold, a drain's own claimed jobs' entries are in
// front of its next claim until vacuum removes them: its claims of 100
// jobs took 0.9 to 1.0 ms from the front against 0.7 to 0.8 from the
// cursor (pg_stat_statements), and a drain claiming from the front only
// ran at 0.91 to 0.95 of one that used the cursor. A claimer that is not
// saturated claims from the front, in strict order, so that a writer's
// job whose run_at (its transaction's start) is older than the last job
// claimed is not left behind the cursor.
const BusyClaim = time.Millisecond

// SlowFront is how long a look from the front must take the server for
// the front to count as held; a quicker look sends the claims back to the
// front. A look at the front of an ordinary queue, one row and no writes,
// takes a tenth of a millisecond or so; the dead entries of some 5,000
// jobs run under a hold take it 2 ms.
const SlowFront = 2 * time.Millisecond

// cursorFirst is where the walk of a claim from the cursor starts: just
// after the cursor, at ($8, $9 + 1) in (run_at, id) order, or, after the
// largest id, at ($8 + 1 µs, the smallest id), which is the same place, as
// a run_at has microseconds: $9 + 1 would be out of range.
const cursorFirst = "SELECT $7::smallint,\n" +
	"            CASE WHEN $9::bigint = 9223372036854775807 THEN $8::timestamptz + interval '1 microsecond' ELSE $8::timestamptz END,\n" +
	"            CASE WHEN $9::bigint = 9223372036854775807 THEN -9223372036854775808 ELSE $9::bigint + 1 END, 1\n" +
	"     WHERE NOT (SELECT paused OR limited FROM p)\n"

// SQL is the claim statement sql from the cursor ($7, $8, $9: the last job
// of the claimer's last claim, in (priority, run_at, id) order): its walk
// over the queue's priorities starts at the cursor rather than at the
// queue's first pending job, so the claim's scan of the cursor's priority,
// and its count of skipped due rows, start after the cursor: at ($8, $9 +
// 1) in (run_at, id) order, which no id falls between (cursorFirst). It panics if sql no
// longer reads as it expects.
func SQL(sql string) string {
	first := strings.Replace(walkFirst, "{first}", Unpaused, 1)
	if strings.Count(sql, first) != 1 {
		panic("claimer: the claim statement's first job is not where cursor.SQL looks for it: " + first)
	}
	return strings.Replace(sql, first, cursorFirst, 1)
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
// A claimer claims from its cursor while the front is held (a claim from
// the front took the server HeldClaim or longer, or a look from the front,
// Looker, SlowFront or longer, and no look has found it quick since; a
// quick claim from the front, the first after a Reset, leaves it held):
// then the dead entries cost more than the strict order is worth, and
// every claim is from the cursor but the first and those after a failed
// claim or a give-back (Reset). While the front is busy (a claim from the front took BusyClaim
// or longer, and no look has found it quick since), only the claims after
// a full claim are from the cursor. Such claims ask for a look, and while
// claims come from the cursor, looks run beside them, on a connection of
// their own: a quick one sends the claims back to the front.
//
// Each claim that took jobs moves the cursor to the last of them; one from
// the front that took none moves it to the claim's time, at the priority
// of its last place, since every due job before that was taken. A claim
// that found the queue paused read no row, and moves nothing. A row that
// becomes due behind the cursor (a higher priority than the last job taken,
// an earlier run_at, a lost claim's job given back, a row that was locked
// when a claim passed it) is found by the next look from the front, and the
// cursor goes back to just before it (Looked).
type Cursor struct {
	Set      bool // else the next claim is from the front
	Priority int16
	RunAt    time.Time
	ID       int64
	Held     bool          // the front is held: every claim from the cursor
	Busy     bool          // the front is busy: claims after a full claim from the cursor
	Full     bool          // the last claim took every job it asked for
	Slow     time.Duration // HeldClaim, BusyClaim and SlowFront, but in tests (negative: every look and claim from the front is slow); 0: those
}

// FromFront reports whether the next claim is from the front.
func (k *Cursor) FromFront() bool { return !k.Set || !k.Held && (!k.Busy || !k.Full) }

// Reset makes the next claim from the front.
func (k *Cursor) Reset() { k.Set = false }

// Claimed moves the cursor after a claim, from the front or not, that
// took runs, every job it asked for if full, ran at at on the database's
// clock and took the server took. It reports whether the claim asks for a
// look from the front: every claim from the cursor does, for the jobs
// behind it, and a claim from the front that took BusyClaim or longer,
// whose time may be the dead entries or only its writes; the look, which
// writes nothing, tells which.
func (k *Cursor) Claimed(front bool, took time.Duration, at time.Time, runs []*runstate.Run, full bool) (look bool) {
	k.Full = full
	look = !front
	if front {
		switch {
		case took >= cmp.Or(k.Slow, HeldClaim) && !full:
			k.Held, look = true, true
		case took >= cmp.Or(k.Slow, BusyClaim):
			k.Busy, look = true, true
		}
	}
	if len(runs) == 0 {
		if front {
			// Every due job before at was taken, but those locked: the
			// ones claimed meanwhile are behind.
			k.Set, k.RunAt, k.ID = true, at, 0
		}
		return look
	}
	k.Set = false
	for _, r := range runs {
		j := r.Job
		if !k.Set || after(j.Priority, j.RunAt, j.ID, k.Priority, k.RunAt, k.ID) {
			k.Set, k.Priority, k.RunAt, k.ID = true, j.Priority, j.RunAt, j.ID
		}
	}
	return look
}

// Looked takes in a look from the front: its time, and the first due job
// it found, if that is behind the cursor, as the cursor's new place, just
// before that job, so that the next claim takes it first.
func (k *Cursor) Looked(l Look) {
	if l.Err != nil {
		return
	}
	k.Held = l.Took >= cmp.Or(k.Slow, SlowFront)
	k.Busy = k.Busy && k.Held
	if l.Found && k.Set && after(k.Priority, k.RunAt, k.ID, l.Priority, l.RunAt, l.ID) {
		k.Priority, k.RunAt, k.ID = l.Priority, l.RunAt, l.ID-1
		if l.ID == math.MinInt64 { // just before it is at the largest id of the microsecond before
			k.RunAt, k.ID = l.RunAt.Add(-time.Microsecond), math.MaxInt64
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
