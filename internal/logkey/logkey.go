// Package logkey names the attributes of Switchboard's logs, once: every
// slog call passes these constants as keys, never a string of its own, so
// that a device, a relay or an error is found under the same key whichever
// component logged it. A test in this package fails on a string literal
// key in a slog call.
//
//	log.Warn("tunnel closed", logkey.Device, device, logkey.Err, err)
package logkey

// What a line is about.
const (
	Device        = "device"         // a device's name
	Relay         = "relay"          // a relay's URL, as an agent dials it
	RelayID       = "relay_id"       // a relay's id, rl-<8 hex>
	Holder        = "holder"         // the id of the relay that holds a device
	By            = "by"             // the id of the relay that asked for what is logged
	Instance      = "instance"       // an agent process's id
	RequestID     = "request_id"     // a user request's id
	TokenID       = "token_id"       // a credential's id
	TokenIDs      = "token_ids"      // credentials' ids
	Component     = "component"      // the part of the relay that logs
	Name          = "name"           // a name the line is about, e.g. the relay's
	Path          = "path"           // a file's path
	Type          = "type"           // an event's type
	Step          = "step"           // a step of an operation, e.g. a rotation
	Remote        = "remote"         // the address of the client that asked
	Signal        = "signal"         // a signal received
	Version       = "version"        // the build's version
	Protocol      = "protocol"       // the protocol an agent speaks
	TunnelVersion = "tunnel_version" // the native tunnel's version, 1 or 2
	Source        = "source"         // the address a user's connection comes from
	Target        = "target"         // a device's service, DEVICE/SERVICE
	Service       = "service"        // a service's name on its device
	Port          = "port"           // a mapped port
	Network       = "network"        // tcp or udp
	Topic         = "topic"          // a broadcast topic's name
	Mode          = "mode"           // how a topic connection takes part: read, write
	Peer          = "peer"           // whether a topic connection is another relay's
	Relays        = "relays"         // relays' ids
	Kind          = "kind"           // how a connection reached the relay: connect, port, connect_udp, port_udp, passthrough
)

// Why, how long and how many.
const (
	Err          = "err"               // the error
	Reason       = "reason"            // why, when it is not an error
	Timeout      = "timeout"           // a time limit
	Spread       = "spread"            // the window a drain spreads its moves over
	Misses       = "misses"            // missed probes in a row
	Tunnels      = "tunnels"           // native tunnels
	Standbys     = "standbys"          // standby tunnels
	Requests     = "requests"          // requests
	NativeAgents = "native_agents"     // native agents
	TopicConns   = "topic_connections" // topic readers and writers
	Cut          = "cut"               // requests or sessions cut
	Listen       = "listen"            // a listener's address
	Admin        = "admin"             // the admin listener's address
	Cause        = "cause"             // what ended a connection
	Limit        = "limit"             // a bound that was reached
	BytesIn      = "bytes_in"          // bytes from the user
	BytesOut     = "bytes_out"         // bytes to the user
	DurationMS   = "duration_ms"       // how long, in milliseconds
	Fingerprint  = "fingerprint"       // a fleet secret's fingerprint
	Accepted     = "accepted"          // the fleet secrets' fingerprints accepted
	Generation   = "generation"        // a fleet secret record's generation
	Dropped      = "dropped"           // datagrams dropped: their flow's queue was full
	Oversized    = "oversized"         // datagrams dropped: over the size a flow carries
	Suppressed   = "suppressed"        // lines of this kind not logged before this one: over the rate
)
