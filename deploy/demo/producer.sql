-- The demo producer: a job of each kind, written with plain SQL as any
-- application would. docker compose runs it every second.
INSERT INTO pgdispatch.jobs (kind, payload) VALUES
  ('http_callback', jsonb_build_object(
      'url', 'http://receiver:8080/hooks/order',
      'data', jsonb_build_object('order', (random() * 1000)::int, 'at', now()))),
  ('rabbitmq', jsonb_build_object(
      'routing_key', 'demo',
      'body', jsonb_build_object('order', (random() * 1000)::int, 'at', now()),
      'headers', jsonb_build_object('source', 'demo-producer'))),
  ('email', jsonb_build_object(
      'to', jsonb_build_array('ann@example.test'),
      'subject', 'Your order ' || (random() * 1000)::int,
      'text', 'Thanks for your order!',
      'html', '<p>Thanks for your order!</p>'));
