// Package amqptest finds the RabbitMQ broker the tests use.
package amqptest

import (
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// URL is RABBITMQ_TEST_URL, else the broker on 127.0.0.1:5672 as guest. When
// it does not answer the test skips with the reason, except under CI=true,
// where it fails.
func URL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("RABBITMQ_TEST_URL")
	if u == "" {
		u = "amqp://guest:guest@127.0.0.1:5672/"
	}
	conn, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("RabbitMQ is required under CI=true and is not reachable: %v", err)
		}
		t.Skipf("RabbitMQ is not reachable (%v); start it, or set RABBITMQ_TEST_URL", err)
	}
	_ = conn.Close()
	return u
}

// Queue declares a durable queue for the test and deletes it when the test ends.
func Queue(t testing.TB, url, name string) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("amqptest: %v", err)
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err == nil {
		_, err = ch.QueueDeclare(name, true, false, false, false, nil)
	}
	if err != nil {
		t.Fatalf("amqptest: declare %s: %v", name, err)
	}
	t.Cleanup(func() {
		conn, err := amqp.Dial(url)
		if err != nil {
			return
		}
		defer func() { _ = conn.Close() }()
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(name, false, false, false)
		}
	})
}

// Drain takes every message from queue and returns them.
func Drain(t testing.TB, url, queue string) []amqp.Delivery {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("amqptest: %v", err)
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("amqptest: %v", err)
	}
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatalf("amqptest: get from %s: %v", queue, err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}
