package claimer

// Cancel is told that the jobs ids were cancelled (by cancel(), in SQL).
// Anyone may NOTIFY, so the notice stops nothing by itself: it makes the
// heartbeat beat now, and the heartbeat stops the runs whose rows it did
// not renew, as it does at every beat. It returns how many of its runs the
// ids name; it does not block. A claim in flight may hold one of those
// jobs before its runs are known: the claim asks for a beat as it ends.
func (c *Claimer) Cancel(ids []int64) int {
	n := c.runs.Notice(ids)
	if n > 0 {
		c.heartbeat.Beat()
	}
	return n
}

// CheckRuns makes the heartbeat beat now, so that runs whose rows are no
// longer theirs stop at once: the worker calls it when its listener has
// connected again, since a cancel notice sent while it was away is lost.
// It does not block.
func (c *Claimer) CheckRuns() { c.heartbeat.Beat() }
