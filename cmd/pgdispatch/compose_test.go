package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors/email"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
	"github.com/pgdispatch/pgdispatch/executors/rabbitmq"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// Docker cannot run here: the compose file is checked with the compose
// specification's own loader instead, and every variable it gives the
// workers must be one pgdispatch reads.
func TestComposeFile(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	opts, err := cli.NewProjectOptions([]string{filepath.Join(root, "docker-compose.yml")},
		cli.WithWorkingDirectory(root), cli.WithName("pgdispatch-demo"))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	project, err := opts.LoadProject(ctx)
	require.NoError(t, err)

	for _, name := range []string{"postgres", "rabbitmq", "rabbitmq-setup", "mailpit", "receiver", "worker", "producer"} {
		require.Contains(t, project.Services, name)
	}
	worker := project.Services["worker"]
	require.NotNil(t, worker.Build, "the worker is built from the Dockerfile")
	require.Equal(t, 3, worker.GetScale())
	require.Equal(t, []string{"run", "--migrate"}, []string(worker.Command), "each replica migrates safely at start")

	var known []string
	for _, g := range settingGroups {
		for _, s := range g {
			known = append(known, s.Env)
		}
	}
	require.NotEmpty(t, worker.Environment)
	for name := range worker.Environment {
		require.Contains(t, known, name, "the worker's %s is not a setting pgdispatch reads", name)
	}
	// The image: built in stages, static, not root.
	dockerfile, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	require.NoError(t, err)
	require.Equal(t, 2, strings.Count(string(dockerfile), "\nFROM "))
	require.Contains(t, string(dockerfile), "CGO_ENABLED=0")
	require.Contains(t, string(dockerfile), "USER nonroot")

	// The demo's services have demo passwords and no authentication on
	// /metrics: they are published on the host's loopback only.
	for name, svc := range project.Services {
		for _, p := range svc.Ports {
			require.Equal(t, "127.0.0.1", p.HostIP, "%s publishes %s:%s on every interface", name, p.Published, strconv.Itoa(int(p.Target)))
		}
	}

	producer := project.Services["producer"]
	require.Len(t, producer.Volumes, 1)
	require.Equal(t, filepath.Join(root, "deploy/demo/producer.sql"), producer.Volumes[0].Source)
	require.FileExists(t, producer.Volumes[0].Source)
}

// The demo producer's SQL inserts one valid job of each kind: run it against
// a real schema and check each payload with its executor's validation.
func TestComposeProducerSQL(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	raw, err := os.ReadFile("../../deploy/demo/producer.sql")
	require.NoError(t, err)
	sql := strings.ReplaceAll(string(raw), "pgdispatch.jobs", pgx.Identifier{schema, "jobs"}.Sanitize())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = pgtest.Pool(t).Exec(ctx, sql)
	require.NoError(t, err)
	rows, err := pgtest.Pool(t).Query(ctx, "SELECT kind, payload FROM "+pgx.Identifier{schema, "jobs"}.Sanitize()+" ORDER BY id")
	require.NoError(t, err)
	kinds := map[string]json.RawMessage{}
	var (
		kind    string
		payload json.RawMessage
	)
	_, err = pgx.ForEachRow(rows, []any{&kind, &payload}, func() error {
		kinds[kind] = slices.Clone(payload)
		return nil
	})
	require.NoError(t, err)
	require.Len(t, kinds, 3)
	require.NoError(t, httpcallback.Validate(kinds["http_callback"]))
	require.NoError(t, rabbitmq.Validate(kinds["rabbitmq"]))
	require.NoError(t, email.Validate(kinds["email"], "pgdispatch@example.test"))
}
