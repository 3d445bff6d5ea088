package redact

import (
	"bytes"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func redacted(r *Filter, s string) string {
	var b bytes.Buffer
	_, _ = fmt.Fprint(r.Writer(&b), s)
	return b.String()
}

func TestRedactor(t *testing.T) {
	t.Parallel()
	r := &Filter{}
	r.AddEnv([]string{
		"DATABASE_URL=postgres://app:Pa@ss/wo%rd@db.internal:5432/app",
		"RABBITMQ_URL=amqp://demo:" + url.PathEscape("q:ueue/pw") + "@broker/",
		"SMTP_PASSWORD=smtp-secret",
		"HTTP_SIGNING_SECRET=whsec_c2lnbmluZy1rZXk=",
		"PATH=/usr/bin:/bin", "LOG_LEVEL=debug", "SHORT_PASSWORD=abc",
	})
	r.AddArgs([]string{
		"jobs", "list", "--database-url=host=db password='kv pass' user=x", "--api-key", "apikeyvalue",
		"--payload", `{"url": "https://bob:payloadpw@hook.test/x"}`,
	})
	for in, want := range map[string]string{
		"lookup ss/wo%rd@db.internal":                     "lookup xxxxx@db.internal",
		"amqp://demo:q%3Aueue%2Fpw@broker/ and q:ueue/pw": "amqp://demo:xxxxx@broker/ and xxxxx",
		"AUTH failed for smtp-secret":                     "AUTH failed for xxxxx",
		"whsec_c2lnbmluZy1rZXk= and c2lnbmluZy1rZXk=":     "xxxxx and xxxxx",
		"password=kv pass apikeyvalue payloadpw":          "password=xxxxx xxxxx xxxxx",
		"user=app database=app /usr/bin debug abc":        "user=app database=app /usr/bin debug abc",
	} {
		require.Equal(t, want, redacted(r, in), in)
	}
	require.Equal(t, "anything", redacted(&Filter{}, "anything"), "no secrets, nothing masked")
}

// Whatever the password, pgx's error for a URL that holds it unencoded
// passes the Filter without a piece of it.
func FuzzRedactConnectionErrors(f *testing.F) {
	for _, pw := range []string{"Sekr1t@Part2/Part3%Part4", "abcd:efgh?ijkl#mnop", "wxyz%41bcde@@@fghi", "a b c defg"} {
		f.Add(pw)
	}
	f.Fuzz(func(t *testing.T, pw string) {
		if strings.ContainsAny(pw, "\x00\n\r") || len(pw) < minSecret {
			return
		}
		dsn := "postgres://nobody:" + pw + "@127.0.0.1:1/none"
		r := &Filter{}
		r.AddEnv([]string{"DATABASE_URL=" + dsn})
		_, err := pgx.ParseConfig(dsn)
		out := dsn
		if err != nil {
			out += "\n" + err.Error()
		}
		out = redacted(r, out)
		require.NotContains(t, out, pw)
		for _, piece := range strings.FieldsFunc(pw, func(c rune) bool { return strings.ContainsRune(pieceSeparators, c) }) {
			if len(piece) >= minSecret {
				require.NotContains(t, out, piece, "password %q", pw)
			}
		}
	})
}

// A key=value password with backslash escapes, as libpq reads them: the
// whole value is masked, as written and as meant, and no tail is left.
func TestRedactEscapedKeyValuePassword(t *testing.T) {
	t.Parallel()
	r := &Filter{}
	r.AddEnv([]string{`DATABASE_URL=host=db password=ab\ cdtail\'q user=x`})
	for in, want := range map[string]string{
		`cannot parse host=db password=ab\ cdtail\'q user=x`: "cannot parse host=db password=xxxxx user=x",
		"the password ab cdtail'q was refused":               "the password xxxxx was refused",
		"cdtail alone":                                       "cdtail alone",
	} {
		require.Equal(t, want, redacted(r, in), in)
	}
}
