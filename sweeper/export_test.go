package sweeper

// SetBatchSize makes each statement of s change at most n rows.
func SetBatchSize(s *Sweeper, n int) { s.batchSize = n }
