package procfleet

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
)

// Relay is one `switchboard serve` process of the fleet, on the same
// addresses and data dir across restarts.
type Relay struct {
	N                     int    // 1, 2, … in the order the relays were added
	Host, Port, AdminPort string // its listeners
	Dir                   string // its data dir
	ID                    string // its relay id, known once it first started

	log string // its log file; empty when it writes to Config.Output

	// up is whether it takes new requests, as a balancer's health check
	// sees it: false from the moment it is killed, frozen or stopped, true
	// again once it is back and ready.
	up    atomic.Bool
	downs atomic.Int64 // how many times it went down, see Downs

	mu      sync.Mutex // guards the fields below
	proc    *Proc      // the current process; nil before the first start
	version string     // what its next start reports (--report-version); empty: its build's
}

// URL is the relay's public listener.
func (r *Relay) URL() string { return "http://" + net.JoinHostPort(r.Host, r.Port) }

// AdminURL is the relay's admin listener (operator API, /readyz, /metrics).
func (r *Relay) AdminURL() string { return "http://" + net.JoinHostPort(r.Host, r.AdminPort) }

// Up reports whether the relay takes new requests: started, ready, and not
// killed, frozen or stopped since.
func (r *Relay) Up() bool { return r.up.Load() }

// Downs counts the times the relay went down (killed, frozen or stopped):
// a request that saw it change met the relay's loss.
func (r *Relay) Downs() int64 { return r.downs.Load() }

// Pid is the current process's id.
func (r *Relay) Pid() int { return r.process().Pid() }

// Done is closed once the current process has exited.
func (r *Relay) Done() <-chan struct{} { return r.process().Done() }

// Alive reports whether the current process runs (frozen counts as
// running).
func (r *Relay) Alive() bool {
	p := r.process()
	return p != nil && !p.Exited()
}

// Kill kills the relay with SIGKILL and returns at once; Done closes when
// it has exited.
func (r *Relay) Kill() error {
	r.down()
	return r.process().Signal(syscall.SIGKILL)
}

// Freeze stops the relay with SIGSTOP: its connections stay open and
// nothing answers on them.
func (r *Relay) Freeze() error {
	r.down()
	return r.process().Signal(syscall.SIGSTOP)
}

// Thaw resumes a frozen relay with SIGCONT.
func (r *Relay) Thaw() error {
	if err := r.process().Signal(syscall.SIGCONT); err != nil {
		return err
	}
	r.up.Store(true)
	return nil
}

// Stop asks the relay to shut down gracefully (SIGTERM, its drain) and
// waits until it has exited; SIGKILL after a grace of 30 s.
func (r *Relay) Stop() {
	r.down()
	r.process().Stop(stopGrace)
}

func (r *Relay) down() {
	r.up.Store(false)
	r.downs.Add(1)
}

func (r *Relay) process() *Proc {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc
}

// exited reports whether the relay's process started and has exited.
func (r *Relay) exited() bool {
	p := r.process()
	return p != nil && p.Exited()
}

func (r *Relay) setProcess(p *Proc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.proc = p
}

// nextVersion returns what the next start reports.
func (r *Relay) nextVersion() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.version
}

// SetVersion sets what the relay's next start reports.
func (r *Relay) SetVersion(v string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.version = v
}
