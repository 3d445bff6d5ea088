package pgdispatch_test

import "github.com/pgdispatch/pgdispatch/migrations"

func migrationsErrMissing() error { return migrations.ErrSchemaMissing }
