package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
)

// natsNode is one nats-server process of a three-node JetStream cluster.
type natsNode struct {
	name          string
	port, cluster string
	conf          string // its configuration file
	cmd           *exec.Cmd
	done          chan struct{}
}

func (n *natsNode) url() string { return "nats://127.0.0.1:" + n.port }

// quorum runs three relays on a real three-node NATS cluster (every bucket
// and stream with three replicas) under load, kills two of the nodes with
// SIGKILL for -nats-outage, so that the survivor accepts connections but
// JetStream has no quorum, counts the failed requests, then brings them back
// and measures how long the fleet takes to converge.
func (b *bench) quorum(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx) // the agents' lifetime
	defer cancel()
	server, err := benchkit.Build(b.o.natsServer, b.dir, "nats-server", "github.com/nats-io/nats-server/v2")
	if err != nil {
		return err
	}
	q := &bench{o: b.o, bin: b.bin, dir: filepath.Join(b.dir, "quorum"), client: b.client,
		relayArgs: []string{"--nats-replicas", "3"}}
	nodes, err := startCluster(ctx, server, filepath.Join(q.dir, "nats"))
	if err != nil {
		return err
	}
	defer stopCluster(nodes)
	var urls []string
	for _, n := range nodes {
		urls = append(urls, n.url())
	}
	q.natsAt = strings.Join(urls, ",")
	devices, _, backend, err := q.startFleet(ctx)
	if err != nil {
		return err
	}
	defer q.stopAll()
	defer backend.Close()
	load := startLoad(ctx, q.relays, devices)
	defer load.stop()
	dir, err := q.directory(ctx)
	if err != nil {
		return err
	}
	load.setHolders(dir)
	<-time.After(2 * time.Second) // the load runs on a healthy cluster first
	healthyAttempted, healthyFailed := load.counts()

	// Two of three nodes die: the third accepts connections, but no stream
	// has a quorum, so writes fail and watches deliver nothing.
	load.reset()
	for _, n := range nodes[1:] {
		n.cmd.Process.Kill()
		<-n.done
	}
	<-time.After(b.o.natsOutage)
	attempted, failed := load.counts()
	summary := load.summary()
	view := q.viewAges(ctx)

	load.reset()
	back := time.Now()
	for _, n := range nodes[1:] {
		if err := n.start(server, filepath.Join(q.dir, "nats", n.name+".log")); err != nil {
			return err
		}
	}
	if err := clusterReady(ctx, urls); err != nil {
		return err
	}
	ready := time.Since(back)
	if err := q.converged(ctx, devices); err != nil {
		return fmt.Errorf("after the quorum returned: %w", err)
	}
	converged := time.Since(back)
	after, afterFailed := load.counts()

	b.logf("\n# Quorum loss: %d devices, 3 relays, a three-node NATS cluster\n\n", len(devices))
	b.logf("Three nats-server processes in a cluster with JetStream; relays started with `--nats` naming all three and `--nats-replicas 3`; the same load as above (GET and POST alternating, two in three through a relay that forwards).\n\n")
	b.logf("- **healthy cluster**, 2 s: %d requests, %d failed\n", healthyAttempted, healthyFailed)
	b.logf("- **two of three NATS nodes killed (SIGKILL) for %s** under load: %d requests, **%d failed** (%s); the relays' views were %s old at the end\n",
		b.o.natsOutage, attempted, failed, summary, view)
	b.logf("- **the two nodes restarted**: every stream with a leader and every replica current after %s; every relay reaching NATS, every relay fresh and every device online after **%s**; %d of %d requests failed meanwhile\n",
		ready.Round(time.Millisecond), converged.Round(time.Millisecond), afterFailed, after)
	return nil
}

// startCluster starts three nats-server processes with JetStream, routed to
// each other, in dir, and waits until JetStream answers through them.
func startCluster(ctx context.Context, server, dir string) ([]*natsNode, error) {
	var nodes []*natsNode
	for i := range 3 {
		nodes = append(nodes, &natsNode{name: fmt.Sprintf("n%d", i+1), port: benchkit.FreePort(), cluster: benchkit.FreePort()})
	}
	var routes []string
	for _, n := range nodes {
		routes = append(routes, "nats-route://127.0.0.1:"+n.cluster)
	}
	for _, n := range nodes {
		store := filepath.Join(dir, n.name)
		if err := os.MkdirAll(store, 0o755); err != nil {
			return nil, err
		}
		n.conf = filepath.Join(dir, n.name+".conf")
		conf := fmt.Sprintf("server_name: %s\nlisten: 127.0.0.1:%s\njetstream { store_dir: %q }\ncluster {\n  name: switchboard\n  listen: 127.0.0.1:%s\n  routes: [%s]\n}\n",
			n.name, n.port, store, n.cluster, strings.Join(routes, ", "))
		if err := os.WriteFile(n.conf, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		if err := n.start(server, filepath.Join(dir, n.name+".log")); err != nil {
			stopCluster(nodes)
			return nil, err
		}
	}
	var urls []string
	for _, n := range nodes {
		urls = append(urls, n.url())
	}
	err := benchkit.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
		nc, err := nats.Connect(strings.Join(urls, ","), nats.Timeout(time.Second))
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		actx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err = js.AccountInfo(actx)
		return err
	})
	if err != nil {
		stopCluster(nodes)
		return nil, fmt.Errorf("the NATS cluster did not form: %w", err)
	}
	return nodes, nil
}

// clusterReady waits until every stream of the cluster (the fleet's buckets
// and event stream) has a leader and every replica is current.
func clusterReady(ctx context.Context, urls []string) error {
	return benchkit.Poll(ctx, 120*time.Second, 100*time.Millisecond, func() error {
		nc, err := nats.Connect(strings.Join(urls, ","), nats.Timeout(time.Second))
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		streams := js.ListStreams(lctx)
		n := 0
		for info := range streams.Info() {
			n++
			c := info.Cluster
			if c == nil || c.Leader == "" {
				return fmt.Errorf("stream %s has no leader", info.Config.Name)
			}
			for _, r := range c.Replicas {
				if !r.Current {
					return fmt.Errorf("stream %s: replica %s not current", info.Config.Name, r.Name)
				}
			}
		}
		if err := streams.Err(); err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("no streams listed")
		}
		return nil
	})
}

// start runs the node's nats-server, its output to logPath.
func (n *natsNode) start(server, logPath string) error {
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	n.cmd = exec.Command(server, "-c", n.conf)
	n.cmd.Stdout, n.cmd.Stderr = out, out
	if err := n.cmd.Start(); err != nil {
		out.Close()
		return err
	}
	n.done = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { c.Wait(); out.Close(); close(done) }(n.cmd, n.done)
	return nil
}

func stopCluster(nodes []*natsNode) {
	for _, n := range nodes {
		if n.cmd != nil && n.cmd.Process != nil {
			select {
			case <-n.done:
			default:
				n.cmd.Process.Kill()
				<-n.done
			}
		}
	}
}
