// Package natsrelay is the relay's publisher for NATS JetStream: Connect
// opens a connection (credentials, NKey, token or user and password; TLS),
// EnsureStream creates or updates a stream with a duplicate window long
// enough for the relay (DefaultDuplicateWindow), and NewJetStreamPublisher
// returns the relay.Publisher that stores a batch asynchronously, one
// message in flight per message group.
//
// It is a package of its own so that a program that relays elsewhere, or
// not at all, does not build the NATS client. See package relay for what
// reaches the stream and when.
package natsrelay
