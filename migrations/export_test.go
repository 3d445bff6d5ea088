package migrations

// MigrateTo is migrateTo, for tests that build a schema as an earlier
// release left it.
var MigrateTo = migrateTo
