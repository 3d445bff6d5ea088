package pgdispatch

// ListenConnConfig is listenConnConfig, for the tests.
var ListenConnConfig = listenConnConfig
