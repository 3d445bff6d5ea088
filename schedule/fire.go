package schedule

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// fired is what fire_schedule_slots did for one schedule: the jobs it
// created, and the slots it could not create one for because a job held
// their dedup_key already, the latest of those keys and that job (nil when
// the job was not committed yet).
type fired struct {
	created, taken int64
	takenKey       *string
	takenBy        *int64
}

// fire creates the jobs of every plan's slots in one statement, and puts
// what it did for each schedule in got.
func (s *Scheduler) fire(ctx context.Context, tx pgx.Tx, plans []plan, got map[int64]fired) error {
	var (
		ids   []int64
		slots []time.Time
	)
	for _, p := range plans {
		for _, slot := range p.slots {
			ids, slots = append(ids, p.id), append(slots, slot)
		}
	}
	if len(slots) == 0 {
		return nil
	}
	if err := s.fireSlots(ctx, tx, ids, slots, got); err != nil {
		return fmt.Errorf("schedules: fire: %w", err)
	}
	return nil
}

// fireOneByOne creates the jobs of each plan's slots in a savepoint of its
// own, after the jobs table refused one of them: a schedule whose job it
// refuses gets the reason in its error, and the others fire.
func (s *Scheduler) fireOneByOne(ctx context.Context, tx pgx.Tx, plans []plan, rows []due, got map[int64]fired) error {
	for i := range plans {
		p := &plans[i]
		if len(p.slots) == 0 {
			continue
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return fmt.Errorf("schedules: savepoint: %w", err)
		}
		ids := make([]int64, len(p.slots))
		for j := range ids {
			ids[j] = p.id
		}
		if err := s.fireSlots(ctx, sp, ids, p.slots, got); err != nil {
			_ = sp.Rollback(ctx)
			msg := "the jobs table refused its job: " + err.Error()
			*p = plan{id: p.id, err: &msg}
			for _, d := range rows {
				if d.id == p.id {
					p.next = d.nextRunAt
				}
			}
			s.logger.Warn("schedules: the jobs table refused a schedule's job; the schedule waits for a change", zap.Int64("schedule_id", p.id), zap.Error(err))
			continue
		}
		if err := sp.Commit(ctx); err != nil {
			return fmt.Errorf("schedules: release savepoint: %w", err)
		}
	}
	return nil
}

func (s *Scheduler) fireSlots(ctx context.Context, tx pgx.Tx, ids []int64, slots []time.Time, got map[int64]fired) error {
	rows, _ := tx.Query(ctx, s.sql["fire"], ids, slots)
	var (
		id int64
		f  fired
	)
	_, err := pgx.ForEachRow(rows, []any{&id, &f.created, &f.taken, &f.takenKey, &f.takenBy}, func() error {
		got[id] = f
		return nil
	})
	return err
}

// settle counts what firing p's slots did: runs are the jobs created; a
// slot whose key a job held already is taken, which the schedule's warning
// and the log say.
func (s *Scheduler) settle(p *plan, f fired) {
	if len(p.slots) == 0 {
		return
	}
	p.runs = f.created
	p.caughtUp = min(p.caughtUp, f.created)
	if f.created == 0 {
		p.last = nil
	}
	if f.taken == 0 {
		return
	}
	p.taken = f.taken
	key, by := "", "a job not committed yet"
	if f.takenKey != nil {
		key = *f.takenKey
	}
	if f.takenBy != nil {
		by = fmt.Sprintf("job %d", *f.takenBy)
	}
	msg := fmt.Sprintf("the dedup_key %s was held by %s, so its slot created no job", key, by)
	if f.taken > 1 {
		msg += fmt.Sprintf(" (nor did %d earlier slots, whose keys were held too)", f.taken-1)
	}
	p.warning = &msg
	s.logger.Warn("schedules: a slot's dedup_key was held by another job; the slot created no job",
		zap.Int64("schedule_id", p.id), zap.Int64("taken", f.taken), zap.String("dedup_key", key), zap.Int64p("held_by", f.takenBy))
}
