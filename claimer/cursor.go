package claimer

import (
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
)

// frontDear is what a look from the front takes, twice in a row, for the
// claimer to stop making one before each sleep.
const frontDear = 5 * time.Millisecond

// frontShare bounds the time a claimer spends on looks from the front of
// its queue: after one, its claims from the cursor take frontShare times as
// long as that look took before the next, so that looks from the front take
// at most about a tenth of its claims' time.
const frontShare = 10

// sleepWindow is how far before the cursor's run_at the look before a sleep
// starts when looks from the front are dear.
const sleepWindow = time.Second

// cursor is where the claimer's next claim starts in its queue's (priority,
// run_at, id) order: just after the last job it took.
//
// A claim from the front walks the claim index from its start, over the
// entries of every job claimed or finished since the database's oldest
// snapshot was taken: while a long transaction holds that snapshot, vacuum
// removes none of them, and a claim from the front costs more with every job
// run meanwhile (about 0.3 µs an entry). A claim from the cursor starts
// after them. It misses only the rows that become due before the cursor: a
// higher priority than the last job taken, or an earlier run_at (a run_at in
// the past, a job whose transaction committed after a later one's, a lease
// given back, a row that was locked when the claim passed it). A claim from
// the front takes those, first, and comes
//   - when the claimer has no cursor yet;
//   - after a claim that skipped locked rows (Result.Stranded);
//   - after the fallback tick;
//   - at once after a claim from the cursor, woken by a notification, that
//     found nothing: the row that notified is before the cursor, or was
//     taken already (as below, when looks from the front are dear);
//   - once the claims from the cursor that took every free slot, since the
//     last look from the front, have taken frontShare times as long as it
//     did: a busy claimer, whose jobs ahead of the cursor keep a job
//     behind it waiting, spends at most about a tenth of its claims' time
//     on looks from the front, and a claimer that keeps up with its queue
//     none but the others above;
//   - at the look before the claimer sleeps (the sleep key granted): rows
//     committed before it are visible then, wherever they are.
//
// But when the last two looks from the front each took frontDear or more,
// the look before a sleep and the one after a notification that found
// nothing start sleepWindow before the cursor's run_at instead, in the
// cursor's priority: they find the jobs of transactions that committed
// late, up to sleepWindow long, and the claimer does not spend a look from
// the front before each sleep. A job of a higher priority, or of a run_at
// further back, that lands behind the cursor then waits for the next of
// the other looks: the fallback tick at the latest.
//
// Only the claim loop's goroutine uses it.
type cursor struct {
	set      bool
	priority int16
	runAt    time.Time
	id       int64

	front     bool          // the next claim starts from the front
	window    bool          // the next claim starts sleepWindow before the cursor
	frontCost time.Duration // what the last claim from the front took
	since     time.Duration // what the full claims from the cursor took since then
	last      bool          // the last claim started from the front
	dear      int           // looks from the front in a row that took frontDear or more
}

// beforeSleep makes the next claim, the claimer's last look before it
// sleeps, start from the front, or, when those looks are dear, sleepWindow
// before the cursor. So does a notification whose claim from the cursor
// found nothing: its row may be behind the cursor, or it may be one that
// the look before the sleep took already.
func (k *cursor) beforeSleep() {
	if k.dear < 2 {
		k.front = true
	} else {
		k.window = true
	}
}

// fromFront says whether the next claim starts from the front.
func (k *cursor) fromFront() bool {
	return !k.set || k.front || k.since >= frontShare*k.frontCost
}

// args are the claim's $7, $8 and $9: the position it starts after.
func (k *cursor) args(front bool) (int16, pgtype.Timestamptz, int64) {
	switch {
	case front:
		return math.MinInt16, pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, math.MinInt64
	case k.window:
		return k.priority, pgtype.Timestamptz{Time: k.runAt.Add(-sleepWindow), Valid: true}, math.MinInt64
	}
	return k.priority, pgtype.Timestamptz{Time: k.runAt, Valid: true}, k.id
}

// claimed moves the cursor after a claim, from the front or not, that took
// runs (in any order) and took d; full: it took every free slot; stranded:
// it skipped locked rows.
func (k *cursor) claimed(front bool, d time.Duration, runs []*runstate.Run, full, stranded bool) {
	k.last, k.window = front, false
	if front {
		k.front, k.frontCost, k.since = false, d, 0
		k.dear++
		if d < frontDear {
			k.dear = 0
		}
	} else if full {
		k.since += d
	}
	k.front = k.front || stranded
	// The claim took its rows in order from where it started: the cursor
	// goes to the last of them, back or forth.
	for i, r := range runs {
		j := r.Job
		if i == 0 || after(j.Priority, j.RunAt, j.ID, k.priority, k.runAt, k.id) {
			k.set, k.priority, k.runAt, k.id = true, j.Priority, j.RunAt, j.ID
		}
	}
}

// after says whether (p, t, id) comes after (p2, t2, id2) in the claim's order.
func after(p int16, t time.Time, id int64, p2 int16, t2 time.Time, id2 int64) bool {
	if p != p2 {
		return p > p2
	}
	if !t.Equal(t2) {
		return t.After(t2)
	}
	return id > id2
}
