// Package xidsql reads a row's xmax, the 32-bit xid of the transaction that
// last locked, updated or deleted it, as that transaction's status. The
// claimer uses it to count the attempt of a held claim that was lost, and
// the admin commands to show the jobs a held claim is running.
package xidsql

// Xid8 is an SQL expression for the 64-bit xid (xid8) of the 32-bit xid
// column col, for pg_xact_status, which takes only xid8.
//
// ref is a bigint expression of an xid already assigned, at or after col's
// transaction: the epoch is ref's, less one when col's value lies beyond
// ref's own (it was assigned before the last wraparound). The result is
// never beyond ref, so pg_xact_status never fails on it as "in the future"
// whatever col holds; at 3 or below (an epoch before the first) it reads
// as frozen. An xid too old for the commit log reads as NULL.
//
// A value that is not a plain xid (a MultiXactId, left by several lockers
// at once, such as a held claim and a foreign key's KEY SHARE) reads as some
// other transaction's status.
func Xid8(col, ref string) string {
	x := col + "::text::bigint"
	return "greatest(((((" + ref + ") >> 32) - (" + x + " > ((" + ref + ") & 4294967295))::int) << 32) | " + x + ", 3)::text::xid8"
}
