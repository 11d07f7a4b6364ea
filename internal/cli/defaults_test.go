package cli

import (
	"bufio"
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/node"
)

// commandFlags returns the flag sets of 'switchboard serve' and 'switchboard
// agent', defaults in place.
func commandFlags() (serve, agentFS *flag.FlagSet) {
	serve = flag.NewFlagSet("serve", flag.ContinueOnError)
	var cfg node.Config
	var logf logFlags
	serveFlags(serve, &cfg, &logf)
	agentFS = flag.NewFlagSet("agent", flag.ContinueOnError)
	var f agentFlags
	f.register(agentFS)
	logf.register(agentFS)
	return serve, agentFS
}

// TestServeFlagDefaultsAreComplete checks that a relay started without flags
// runs with the defaults Complete fills into a zero node.Config: the flags
// and the components take their defaults from the same constants.
func TestServeFlagDefaultsAreComplete(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var fromFlags node.Config
	var logf logFlags
	serveFlags(fs, &fromFlags, &logf)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	var zero node.Config
	for _, c := range []*node.Config{&fromFlags, &zero} {
		completeNode(c)
	}
	if !reflect.DeepEqual(fromFlags, zero) {
		t.Errorf("serve's flag defaults differ from Complete's:\nflags:    %+v\nComplete: %+v", fromFlags, zero)
	}
}

// completeNode fills every default of c and of the components' configs in
// it, then drops what cannot be compared (loggers, hooks).
func completeNode(c *node.Config) {
	c.Complete()
	c.Fleet.Complete()
	c.Watchdog.Complete()
	c.Liveness = c.Liveness.WithDefaults()
	c.Logger, c.Broker.Logger = nil, nil
	c.Fleet.Logger, c.Fleet.OnShouldDrain, c.Fleet.OnChange, c.Fleet.OnMove, c.Fleet.OnCancel, c.Fleet.OnSendBack = nil, nil, nil, nil, nil, nil
	c.Fleet.Standbys, c.Fleet.OnPromote, c.Fleet.OnRecordedHere, c.Fleet.OnHandOver, c.Fleet.Answering = nil, nil, nil, nil, nil
	c.Watchdog.Logger, c.Watchdog.OnVeto, c.Watchdog.OnClear = nil, nil, nil
}

// TestAgentFlagDefaultsAreComplete is TestServeFlagDefaultsAreComplete for
// 'switchboard agent'.
func TestAgentFlagDefaultsAreComplete(t *testing.T) {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	var f agentFlags
	f.register(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SWITCHBOARD_TOKEN", "")
	fromFlags, err := f.config()
	if err != nil {
		t.Fatal(err)
	}
	zero := agent.Config{PreserveHost: true} // the command line's own default, documented on the field
	for _, c := range []*agent.Config{&fromFlags, &zero} {
		c.Complete()
		c.Logger = nil
	}
	if !reflect.DeepEqual(fromFlags, zero) {
		t.Errorf("agent's flag defaults differ from Complete's:\nflags:    %+v\nComplete: %+v", fromFlags, zero)
	}
}

// TestDocumentedDefaults reads every "| flag | default | … |" table in docs/
// and checks each default it states against the flag's: the docs cannot
// drift from the constants the flags take.
func TestDocumentedDefaults(t *testing.T) {
	serve, agentFS := commandFlags()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(files) == 0 {
		t.Fatalf("no docs found: %v", err)
	}
	checked := 0
	for _, file := range files {
		for _, row := range defaultRows(t, file) {
			sets := []*flag.FlagSet{serve, agentFS}
			if row.agentSection {
				sets = []*flag.FlagSet{agentFS, serve}
			}
			for i, name := range row.flags {
				fl := lookup(sets, name)
				if fl == nil {
					t.Errorf("%s:%d: --%s is documented but no command has it", file, row.line, name)
					continue
				}
				doc := row.defaults[i%len(row.defaults)]
				if msg := compareDefault(fl, doc); msg != "" {
					t.Errorf("%s:%d: --%s: the docs say %q, %s", file, row.line, name, doc, msg)
				}
				checked++
			}
		}
	}
	if checked < 40 {
		t.Errorf("checked only %d documented defaults: is the tables' layout still | flag | default | … |?", checked)
	}
}

// defaultRow is one row of a docs table of flags and their defaults.
type defaultRow struct {
	line         int
	flags        []string // without the dashes
	defaults     []string // one per flag, or fewer to be cycled through
	agentSection bool     // under a heading about the agent
}

func defaultRows(t *testing.T, file string) []defaultRow {
	t.Helper()
	fh, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	var rows []defaultRow
	inTable, agentSection := false, false
	sc := bufio.NewScanner(fh)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") {
			agentSection = strings.Contains(strings.ToLower(line), "agent")
		}
		if !strings.HasPrefix(line, "|") {
			if line != "" {
				inTable = false
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if len(cells) >= 2 && cells[0] == "flag" && cells[1] == "default" {
			inTable = true
			continue
		}
		if !inTable || len(cells) < 2 || strings.HasPrefix(cells[0], "---") {
			continue
		}
		var flags []string
		for _, f := range strings.Split(cells[0], ",") {
			f = strings.TrimSpace(f)
			if name, ok := strings.CutPrefix(f, "`--"); ok {
				name, _, _ = strings.Cut(name, "`")
				name, _, _ = strings.Cut(name, " ")
				flags = append(flags, name)
			}
		}
		if len(flags) == 0 {
			continue // a limit with no flag, e.g. "header read timeout"
		}
		var defaults []string
		for _, d := range strings.Split(cells[1], ",") {
			defaults = append(defaults, strings.Trim(strings.TrimSpace(d), "`"))
		}
		if len(flags)%len(defaults) != 0 {
			defaults = []string{cells[1]} // one phrase for them all
		}
		rows = append(rows, defaultRow{line: n, flags: flags, defaults: defaults, agentSection: agentSection})
	}
	if err := sc.Err(); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	return rows
}

func lookup(sets []*flag.FlagSet, name string) *flag.Flag {
	for _, fs := range sets {
		if f := fs.Lookup(name); f != nil {
			return f
		}
	}
	return nil
}

// compareDefault says how fl's default differs from the documented one, or
// "" when they agree. A default the docs describe in words ("derived from
// --listen", "3 heartbeats", "system roots") must be a zero flag value,
// which the component then fills in.
func compareDefault(fl *flag.Flag, doc string) string {
	// Flags that share a variable (a reference name and ours) all report
	// the variable's value, so each flag's own default is read from its
	// DefValue, in the variable's type.
	getter, ok := fl.Value.(flag.Getter)
	if !ok {
		return "" // a repeatable flag (--service, --broadcast-path): no default to hold
	}
	switch getter.Get().(type) {
	case time.Duration:
		v, _ := time.ParseDuration(fl.DefValue)
		d, ok := docDuration(doc)
		switch {
		case !ok && v == 0:
			return ""
		case !ok:
			return "not a duration, but the flag's default is " + v.String()
		case d != v:
			return "but the flag's default is " + v.String()
		}
	case int, int64:
		n, _ := strconv.ParseInt(fl.DefValue, 10, 64)
		d, ok := docSize(doc)
		switch {
		case !ok && n == 0:
			return ""
		case !ok:
			return "not a number, but the flag's default is " + strconv.FormatInt(n, 10)
		case d != n:
			return "but the flag's default is " + strconv.FormatInt(n, 10)
		}
	case bool:
		v, _ := strconv.ParseBool(fl.DefValue)
		if want := map[string]bool{"on": true, "off": false}; want[doc] != v {
			return "but the flag's default is " + strconv.FormatBool(v)
		}
	case string:
		v := fl.DefValue
		if v == "" || v == doc {
			return ""
		}
		return "but the flag's default is " + strconv.Quote(v)
	}
	return ""
}

// docDuration reads "2s", "2 s", "400 ms", "30 min".
func docDuration(s string) (time.Duration, bool) {
	s = strings.ReplaceAll(s, " ", "")
	s = strings.Replace(s, "min", "m", 1)
	d, err := time.ParseDuration(s)
	return d, err == nil
}

// docSize reads "512", "64 KiB", "1 MiB".
func docSize(s string) (int64, bool) {
	num, unit, _ := strings.Cut(s, " ")
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		return 0, false
	}
	switch unit {
	case "":
		return n, true
	case "KiB":
		return n << 10, true
	case "MiB":
		return n << 20, true
	}
	return 0, false
}
