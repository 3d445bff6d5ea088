package pgdispatch

import "time"

// ListenConnConfig is listenConnConfig, for the tests.
var ListenConnConfig = listenConnConfig

// SetReconnect bounds the reconnect backoff of the listener of a worker
// made from cfg; zero means the listener's default.
func SetReconnect(cfg *Config, lo, hi time.Duration) { cfg.reconnectMin, cfg.reconnectMax = lo, hi }
