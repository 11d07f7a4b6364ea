package cli

import (
	"strings"

	"github.com/switchboard-relay/switchboard/internal/config"
)

// flagOf names the flag that fills each validated Config field, keyed by
// component and field as config.FieldError carries them: the one table that
// turns a component's words into the command line's.
var flagOf = map[string]string{
	"node.Listen":             "--listen",
	"node.AdminListen":        "--admin-listen",
	"node.Advertise":          "--advertise",
	"node.TLSCertFile":        "--tls-cert",
	"node.TLSKeyFile":         "--tls-key",
	"node.SNIZone":            "--sni-zone",
	"node.AdminTLSCertFile":   "--admin-tls-cert",
	"node.AdminTLSKeyFile":    "--admin-tls-key",
	"node.Fleet.MaxForward":   "--max-forward",
	"node.MaxStreamsPerAgent": "--max-streams-per-agent",
	"node.NATS":               "--nats",
	"node.NATSListen":         "--nats-listen",

	"broker.NoAgentGrace":           "--no-agent-grace",
	"broker.PickupTimeout":          "--pickup-timeout",
	"broker.InactiveRequestTimeout": "--inactive_request_timeout",
	"broker.InactiveBackendTimeout": "--inactive_backend_timeout",
	"broker.MaxPendingPerDevice":    "--max-pending-per-device",
	"broker.MaxBodyBytes":           "--max-request-body",
	"broker.BlockSize":              "--block_size",

	"fleet.BeatInterval": "--heartbeat-interval",
	"fleet.FreshAfter":   "--fresh-after",
	"fleet.LostWindow":   "--lost-window",

	"store.URLs":                     "--nats",
	"store.Listen":                   "--nats-listen",
	"store.Replicas":                 "--nats-replicas",
	"store.CAFile":                   "--nats-ca-file",
	"store.Credentials.User":         "--nats-user",
	"store.Credentials.PasswordFile": "--nats-password-file",
	"store.Credentials.TokenFile":    "--nats-token-file",
	"store.Credentials.NkeySeedFile": "--nats-nkey-file",
	"store.Credentials.CredsFile":    "--nats-creds",

	"agent.Relays":         "--relay",
	"agent.Device":         "--device",
	"agent.Backend":        "--backend",
	"agent.BackendH2C":     "--backend-h2c",
	"agent.Protocol":       "--protocol",
	"agent.BroadcastPaths": "--broadcast-path",
	"agent.TunnelVersion":  "--tunnel-version",
	"agent.Passthrough":    "--tls-passthrough",
}

// withFlagNames returns err with every configuration error in it told in
// the command line's words: "--pickup-timeout must be positive" for
// "broker: PickupTimeout must be positive". A field no flag fills keeps
// its component's words. The result still matches err with errors.Is/As.
func withFlagNames(err error) error {
	fields := config.Fields(err)
	if len(fields) == 0 {
		return err
	}
	msg := err.Error()
	for _, fe := range fields {
		name := func(field string) string {
			if f, ok := flagOf[fe.Component+"."+field]; ok {
				return f
			}
			return field
		}
		told := fe.Message(name)
		if _, ok := flagOf[fe.Component+"."+fe.Field]; !ok {
			told = fe.Component + ": " + told
		}
		msg = strings.Replace(msg, fe.Error(), told, 1)
	}
	return &flagNamedError{msg: msg, err: err}
}

// flagNamedError is an error told with the command line's flag names.
type flagNamedError struct {
	msg string
	err error
}

func (e *flagNamedError) Error() string { return e.msg }
func (e *flagNamedError) Unwrap() error { return e.err }
