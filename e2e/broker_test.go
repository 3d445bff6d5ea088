package e2e

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/amqptest"
)

// broker is a virtual host of its own on the machine's RabbitMQ, so that
// closing every connection to it spares everyone else's.
type broker struct {
	vhost, queue string
	url          string
}

func newBroker(t *testing.T, vhost string) *broker {
	t.Helper()
	base := amqptest.URL(t)
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("rabbitmqctl is required under CI=true to close the broker's connections")
		}
		t.Skip("rabbitmqctl not found: it closes the broker's connections")
	}
	u, err := url.Parse(base)
	require.NoError(t, err)
	user := u.User.Username()
	ctl(t, "add_vhost", vhost)
	t.Cleanup(func() { _ = exec.Command("rabbitmqctl", "-q", "delete_vhost", vhost).Run() })
	ctl(t, "set_permissions", "-p", vhost, user, ".*", ".*", ".*")
	u.Path = "/" + vhost
	b := &broker{vhost: vhost, queue: "e2e", url: u.String()}
	amqptest.Queue(t, b.url, b.queue)
	return b
}

func ctl(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "rabbitmqctl", append([]string{"-q"}, args...)...).CombinedOutput()
	require.NoError(t, err, "rabbitmqctl %v: %s", args, out)
}

// closeAll closes every connection to the virtual host, as
// rabbitmqctl close_all_connections does on a broker restart.
func (b *broker) closeAll(t *testing.T) {
	ctl(t, "close_all_connections", "-p", b.vhost, "e2e: closing on purpose")
}

// receive takes every message from the queue and counts them by the key in
// their body.
func (b *broker) receive(t *testing.T) (map[string]int, []time.Time) {
	t.Helper()
	got := map[string]int{}
	var times []time.Time
	for _, m := range amqptest.Drain(t, b.url, b.queue) {
		var body struct {
			K string `json:"k"`
		}
		require.NoError(t, json.Unmarshal(m.Body, &body), "message %s", m.MessageId)
		got[body.K]++
		times = append(times, m.Timestamp)
	}
	return got, times
}
