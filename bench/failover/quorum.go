package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
	"github.com/switchboard-relay/switchboard/bench/internal/procfleet"
	"github.com/switchboard-relay/switchboard/internal/natscluster"
)

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
	q := &bench{o: b.o, bin: b.bin, dir: filepath.Join(b.dir, "quorum"),
		relayArgs: append([]string{"--nats-replicas", "3"}, b.o.relayFlags...)}
	cluster, err := natscluster.Start(ctx, server, filepath.Join(q.dir, "nats"), 3)
	if err != nil {
		return err
	}
	defer cluster.Stop()
	q.nats = cluster.URLs()
	devices, _, backend, err := q.startFleet(ctx)
	if err != nil {
		return err
	}
	defer q.stop(backend)
	load := procfleet.StartLoad(ctx, q.f.Relays(), devices, 5*time.Millisecond)
	defer load.Stop()
	dir, err := q.directory(ctx)
	if err != nil {
		return err
	}
	load.SetHolders(dir)
	<-time.After(2 * time.Second) // the load runs on a healthy cluster first
	healthyAttempted, healthyFailed := load.Counts()

	// Two of three nodes die: the third accepts connections, but no stream
	// has a quorum, so writes fail and watches deliver nothing.
	load.Reset()
	cluster.Kill(1)
	cluster.Kill(2)
	<-time.After(b.o.natsOutage)
	attempted, failed := load.Counts()
	summary := load.Summary()
	view := q.viewAges(ctx)

	load.Reset()
	back := time.Now()
	for _, i := range []int{1, 2} {
		if err := cluster.Restart(i); err != nil {
			return err
		}
	}
	if err := cluster.Ready(ctx, 120*time.Second); err != nil {
		return err
	}
	ready := time.Since(back)
	if err := q.converged(ctx, devices); err != nil {
		return fmt.Errorf("after the quorum returned: %w", err)
	}
	converged := time.Since(back)
	after, afterFailed := load.Counts()

	b.logf("\n# Quorum loss: %d devices, 3 relays, a three-node NATS cluster\n\n", len(devices))
	b.logf("Three nats-server processes in a cluster with JetStream; relays started with `--nats` naming all three and `--nats-replicas 3`; the same load as above (GET and POST alternating, two in three through a relay that forwards).\n\n")
	b.logf("- **healthy cluster**, 2 s: %d requests, %d failed\n", healthyAttempted, healthyFailed)
	b.logf("- **two of three NATS nodes killed (SIGKILL) for %s** under load: %d requests, **%d failed** (%s); the relays' views were %s old at the end\n",
		b.o.natsOutage, attempted, failed, summary, view)
	b.logf("- **the two nodes restarted**: every stream with a leader and every replica current after %s; every relay reaching NATS, every relay fresh and every device online after **%s**; %d of %d requests failed meanwhile\n",
		ready.Round(time.Millisecond), converged.Round(time.Millisecond), afterFailed, after)
	return nil
}
