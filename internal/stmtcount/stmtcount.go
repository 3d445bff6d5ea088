// Package stmtcount counts the transactions and statements a pgx pool sends.
package stmtcount

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// Counter is a pgx tracer that counts what a pool sends, as the bench's
// idle scenario counts a worker's: each batch and each statement outside a
// transaction is one transaction, and every statement is one statement.
type Counter struct {
	Transactions, Statements atomic.Int64
}

func (s *Counter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	s.Statements.Add(1)
	if conn.PgConn().TxStatus() == 'I' {
		s.Transactions.Add(1)
	}
	return ctx
}

func (s *Counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *Counter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	s.Transactions.Add(1)
	return ctx
}

func (s *Counter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	s.Statements.Add(1)
}

func (s *Counter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
