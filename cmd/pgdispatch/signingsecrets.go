package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/settings"
	"github.com/pgdispatch/pgdispatch/signing"
)

// defaultOverlap is how long the old secrets sign beside a new one unless
// told otherwise.
const defaultOverlap = 24 * time.Hour

const secretsUsage = `Usage:
  pgdispatch secrets rotate [--overlap 24h] --print | --stdin
  pgdispatch secrets list [--json]

rotate adds a signing secret for http_callback requests, which signs every
request from the workers' next one on, without a restart; the secrets
before it sign too until the overlap ends, so that receivers can move to
the new secret meanwhile. --print makes the new secret and prints it, once;
--stdin reads it (whsec_ and base64) from standard input. list shows each
secret's id, when it was made and when it stops signing, never the secret.
HTTP_SIGNING_SECRET, when set, signs too. See docs/operations.md,
"Rotating the signing secret".
Run 'pgdispatch secrets COMMAND --help' for the flags.
`

func secretsCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return subcommand(ctx, "secrets", secretsUsage, map[string]commandFunc{
		"rotate": secretsRotate, "list": secretsList,
	}, args, stdout, stderr)
}

// secretsIn is where rotate --stdin reads the secret.
var secretsIn io.Reader = os.Stdin

func secretsRotate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("secrets rotate", "Add a signing secret for http_callback requests; the others sign too until --overlap ends.", stderr)
	v := settings.New(fs, connSettings)
	overlap := fs.Duration("overlap", defaultOverlap, "how long the secrets before it keep signing beside it; 0: they stop at once")
	printSecret := fs.Bool("print", false, "make a new secret and print it, once: give it to the receivers")
	fromStdin := fs.Bool("stdin", false, "read the new secret, whsec_ and base64 of 16 to 64 bytes, from standard input")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *overlap < 0 {
		return usageError(fs, "--overlap must be zero or more, not %s", *overlap)
	}
	if *printSecret == *fromStdin {
		return usageError(fs, "give --print or --stdin: the receivers need the new secret")
	}
	var secret signing.Secret
	if *fromStdin {
		line, err := bufio.NewReader(io.LimitReader(secretsIn, 1024)).ReadString('\n')
		if err != nil && err != io.EOF {
			return fmt.Errorf("read the secret from standard input: %w", err)
		}
		if secret, err = signing.ParseSecret(line); err != nil {
			return err
		}
	} else {
		secret = signing.Generate()
	}
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		r, err := a.RotateSigningSecret(ctx, secret, *overlap)
		if err != nil {
			return err
		}
		if *printSecret {
			fmt.Fprintf(stdout, "%s\n", secret.Text())
		}
		if r.OthersExpireAt == nil {
			fmt.Fprintf(stderr, "signing secret %d signs from now on, alone\n", r.ID)
		} else {
			fmt.Fprintf(stderr, "signing secret %d signs from now on; the ones before it sign too until %s\n",
				r.ID, r.OthersExpireAt.Local().Format(time.RFC3339))
		}
		return nil
	})
}

func secretsList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("secrets list", "List the signing secrets: ids, when they were made and when they stop signing, never the secrets.", stderr)
	v := settings.New(fs, connSettings)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		secrets, err := a.SigningSecrets(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			if secrets == nil {
				secrets = []admin.SigningSecret{}
			}
			return printJSON(stdout, secrets)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tCREATED\tEXPIRES\tSIGNS")
		for _, s := range secrets {
			expires, signs := "-", "yes"
			if s.ExpiresAt != nil {
				expires = s.ExpiresAt.Local().Format(time.RFC3339)
			}
			if s.Expired {
				signs = "no"
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", s.ID, s.CreatedAt.Local().Format(time.RFC3339), expires, signs)
		}
		return tw.Flush()
	})
}
