// Package triggers holds the contract between the database triggers that
// announce work and the listener that hears them.
//
// The jobs table's triggers (created by package migrations) send
// pg_notify(channel, queue) when a statement makes a job pending and due, or
// due within the next minute. The channel is the schema's name, so two
// pgdispatch schemas in one database never hear each other. The payload is
// only the queue name: PostgreSQL folds identical notifications within one
// transaction, so a bulk insert wakes each queue once.
package triggers

// Channel is the NOTIFY channel of the pgdispatch installation in schema.
func Channel(schema string) string { return schema }
