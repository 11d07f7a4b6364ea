package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/ports"
)

// runPorts runs 'switchboard ctl ports': the fleet's public port mappings.
func runPorts(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	return runSubcommand(ctx, g, "ctl ports", args, stdout, stderr, []subcommand{
		{"add", portsAdd},
		{"list", portsList},
		{"remove", portsRemove},
	})
}

// portArg reads the PORT argument of a ports command.
func portArg(cmd, s string) (int, error) {
	port, err := strconv.Atoi(s)
	if err != nil || port < 1 || port > 65535 {
		return 0, usageErrorf("%s: port %q: give a number from 1 to 65535", cmd, s)
	}
	return port, nil
}

func portsAdd(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	const cmd = "ctl ports add"
	fs := newFlagSet(cmd, stderr)
	g.register(fs)
	udp := fs.Bool("udp", false, "map the UDP port instead of the TCP port")
	var allow deviceList
	fs.Var(&allow, "allow", "source `CIDR` or address that may connect (repeatable, or comma-separated); none: every source")
	maxConns := fs.Int("max-connections", 0, "bound the connections (UDP: flows) open at once through each relay; 0: no bound")
	proxy := fs.Bool("proxy-protocol", false, "send the service a PROXY protocol v2 header first, with the user's address (TCP only)")
	pos, err := parseWithArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usageErrorf("%s: give PORT and DEVICE/SERVICE, got %d arguments", cmd, len(pos))
	}
	port, err := portArg(cmd, pos[0])
	if err != nil {
		return err
	}
	if err := g.validate(); err != nil {
		return err
	}
	req := control.PortRequest{Port: port, Network: ports.TCP, Target: pos[1], Allow: allow, MaxConnections: *maxConns, ProxyProtocol: *proxy}
	if *udp {
		req.Network = ports.UDP
	}
	c, err := g.client()
	if err != nil {
		return err
	}
	m, err := c.AddPort(ctx, req)
	if err != nil {
		return fmt.Errorf("%s: %w", cmd, g.explain(err))
	}
	if g.output == outputJSON {
		return writeJSON(stdout, m)
	}
	fmt.Fprintf(stdout, "mapped %s port %d to %s on every relay\n", m.Network, m.Port, m.Target)
	return nil
}

func portsList(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	return listCommand(ctx, g, "ctl ports list", args, stdout, stderr, (*control.Client).ListPorts, writePortTable)
}

func writePortTable(w io.Writer, ms []control.PortMapping, _ time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "PORT\tNETWORK\tTARGET\tALLOW\tMAX_CONNECTIONS\tPROXY_PROTOCOL\tCREATED")
	for _, m := range ms {
		allow, limit := "any", "-"
		if len(m.Allow) > 0 {
			allow = strings.Join(m.Allow, ",")
		}
		if m.MaxConnections > 0 {
			limit = strconv.Itoa(m.MaxConnections)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%v\t%s\n", m.Port, m.Network, m.Target, allow, limit, m.ProxyProtocol, m.CreatedAt.Format(time.RFC3339))
	}
	return tw.Flush()
}

func portsRemove(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	const cmd = "ctl ports remove"
	fs := newFlagSet(cmd, stderr)
	g.register(fs)
	udp := fs.Bool("udp", false, "unmap the UDP port instead of the TCP port")
	pos, err := parseWithArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErrorf("%s: give exactly one PORT (see 'ctl ports list'), got %d", cmd, len(pos))
	}
	port, err := portArg(cmd, pos[0])
	if err != nil {
		return err
	}
	if err := g.validate(); err != nil {
		return err
	}
	network := ports.TCP
	if *udp {
		network = ports.UDP
	}
	c, err := g.client()
	if err != nil {
		return err
	}
	m, err := c.RemovePort(ctx, network, port)
	if err != nil {
		return fmt.Errorf("%s: %w", cmd, g.explain(err))
	}
	if g.output == outputJSON {
		return writeJSON(stdout, m)
	}
	fmt.Fprintf(stdout, "unmapped %s port %d (was %s); every relay closes it\n", m.Network, m.Port, m.Target)
	return nil
}
