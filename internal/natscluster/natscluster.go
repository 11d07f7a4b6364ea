// Package natscluster runs a JetStream cluster of real nats-server
// processes on loopback, for the tests and benchmarks that must lose NATS
// nodes the way a fleet does: killed, then started again on their stores.
//
//	c, err := natscluster.Start(ctx, serverBinary, dir, 3)
//	defer c.Stop()
//	urls := c.URLs()      // --nats for the relays
//	c.Kill(1); c.Kill(2)  // the survivor has no quorum
//	c.Restart(1); c.Restart(2)
//	c.Ready(ctx, time.Minute) // every stream has a leader and current replicas
package natscluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// pollEvery is how often Start and Ready ask the cluster again.
const pollEvery = 100 * time.Millisecond

// Cluster is a running cluster of nats-server processes.
type Cluster struct {
	server string // the nats-server binary
	dir    string
	nodes  []*node
}

// node is one nats-server process of the cluster.
type node struct {
	name          string
	port, cluster int
	conf          string // its configuration file
	log           string // where its output goes
	cmd           *exec.Cmd
	done          chan struct{} // closed when the process has exited
}

// Start runs n nats-server processes of the binary server with JetStream,
// routed to one another, their stores and logs in dir, and waits until
// JetStream answers through them.
func Start(ctx context.Context, server, dir string, n int) (*Cluster, error) {
	c := &Cluster{server: server, dir: dir}
	for i := range n {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		route, err := freePort()
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, &node{name: fmt.Sprintf("n%d", i+1), port: port, cluster: route})
	}
	var routes []string
	for _, nd := range c.nodes {
		routes = append(routes, "nats-route://127.0.0.1:"+strconv.Itoa(nd.cluster))
	}
	for _, nd := range c.nodes {
		store := filepath.Join(dir, nd.name)
		if err := os.MkdirAll(store, 0o755); err != nil {
			return nil, err
		}
		nd.conf, nd.log = filepath.Join(dir, nd.name+".conf"), filepath.Join(dir, nd.name+".log")
		conf := fmt.Sprintf("server_name: %s\nlisten: 127.0.0.1:%d\njetstream { store_dir: %q }\ncluster {\n  name: switchboard\n  listen: 127.0.0.1:%d\n  routes: [%s]\n}\n",
			nd.name, nd.port, store, nd.cluster, strings.Join(routes, ", "))
		if err := os.WriteFile(nd.conf, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		if err := nd.start(server); err != nil {
			c.Stop()
			return nil, err
		}
	}
	// Every node must answer for JetStream, not just one: a client that
	// connects to a node not yet routed to the others gets no responders.
	err := poll(ctx, 30*time.Second, func(ctx context.Context) error {
		for _, nd := range c.nodes {
			err := withJetStream(nd.url(), func(js jetstream.JetStream) error {
				_, err := js.AccountInfo(ctx)
				return err
			})
			if err != nil {
				return fmt.Errorf("node %s: %w", nd.name, err)
			}
		}
		return nil
	})
	if err != nil {
		c.Stop()
		return nil, fmt.Errorf("the NATS cluster did not form: %w", err)
	}
	return c, nil
}

// URLs are the client URLs of every node.
func (c *Cluster) URLs() []string {
	var urls []string
	for _, nd := range c.nodes {
		urls = append(urls, nd.url())
	}
	return urls
}

// Kill ends node i with SIGKILL and waits for it to exit.
func (c *Cluster) Kill(i int) {
	nd := c.nodes[i]
	if nd.cmd == nil {
		return
	}
	nd.cmd.Process.Kill()
	<-nd.done
	nd.cmd = nil
}

// Restart starts node i again on its store, as it was before Kill.
func (c *Cluster) Restart(i int) error {
	if c.nodes[i].cmd != nil {
		return fmt.Errorf("NATS node %s is running", c.nodes[i].name)
	}
	return c.nodes[i].start(c.server)
}

// Ready waits, at most within, until every stream of the cluster has a
// leader and every replica of it is current.
func (c *Cluster) Ready(ctx context.Context, within time.Duration) error {
	return poll(ctx, within, func(ctx context.Context) error {
		return c.withJetStream(func(js jetstream.JetStream) error {
			streams := js.ListStreams(ctx)
			n := 0
			for info := range streams.Info() {
				n++
				cl := info.Cluster
				if cl == nil || cl.Leader == "" {
					return fmt.Errorf("stream %s has no leader", info.Config.Name)
				}
				for _, r := range cl.Replicas {
					if !r.Current {
						return fmt.Errorf("stream %s: replica %s not current", info.Config.Name, r.Name)
					}
				}
			}
			if err := streams.Err(); err != nil {
				return err
			}
			if n == 0 {
				return errors.New("no streams listed")
			}
			return nil
		})
	})
}

// Stop kills every node still running.
func (c *Cluster) Stop() {
	for i := range c.nodes {
		c.Kill(i)
	}
}

// withJetStream calls f with a JetStream context on a fresh connection to
// the cluster.
func (c *Cluster) withJetStream(f func(jetstream.JetStream) error) error {
	return withJetStream(strings.Join(c.URLs(), ","), f)
}

// withJetStream calls f with a JetStream context on a fresh connection to
// the servers at urls, comma-separated.
func withJetStream(urls string, f func(jetstream.JetStream) error) error {
	nc, err := nats.Connect(urls, nats.Timeout(time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	return f(js)
}

// url is the node's client URL.
func (nd *node) url() string { return "nats://127.0.0.1:" + strconv.Itoa(nd.port) }

// start runs the node's nats-server, its output appended to its log.
func (nd *node) start(server string) error {
	out, err := os.OpenFile(nd.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(server, "-c", nd.conf)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("starting NATS node %s: %w", nd.name, err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		out.Close()
		close(done)
	}()
	nd.cmd, nd.done = cmd, done
	return nil
}

// poll calls f, each call bounded to a second, until it succeeds or within
// has passed, and returns its last error.
func poll(ctx context.Context, within time.Duration, f func(context.Context) error) error {
	deadline := time.Now().Add(within)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := f(cctx)
		cancel()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollEvery):
		}
	}
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
