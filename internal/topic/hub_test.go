package topic

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// clock is a settable clock for the lag tests.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

func newTestHub(t *testing.T, cfg Config) *Hub {
	t.Helper()
	h, err := NewHub(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func msg(s string) Message { return Message{Data: []byte(s)} }

// take returns what r has queued now, without waiting.
func take(t *testing.T, r *Reader) ([]string, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	batch, err := r.Next(ctx, nil)
	var out []string
	for _, m := range batch {
		out = append(out, string(m.Data))
	}
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return out, err
}

func TestReadersGetEveryMessageInOrder(t *testing.T) {
	h := newTestHub(t, Config{})
	key := Key{"cam", "video"}
	a, _ := h.Join(key, false)
	b, _ := h.Join(key, false)
	w, _ := h.Write(key)
	for i := range 10 {
		w.Publish(msg(fmt.Sprint(i)))
	}
	want := "[0 1 2 3 4 5 6 7 8 9]"
	for _, r := range []*Reader{a, b} {
		got, err := take(t, r)
		if err != nil || fmt.Sprint(got) != want {
			t.Fatalf("reader got %v, %v; want %s", got, err, want)
		}
	}
}

func TestFullQueueDropsWholeOldestMessages(t *testing.T) {
	h := newTestHub(t, Config{QueueMessages: 3, QueueBytes: 10})
	key := Key{"cam", "video"}
	slow, _ := h.Join(key, false)
	fast, _ := h.Join(key, false)
	w, _ := h.Write(key)
	var fastGot []string
	for i := range 6 {
		w.Publish(msg(fmt.Sprint(i)))
		got, _ := take(t, fast)
		fastGot = append(fastGot, got...)
	}
	got, err := take(t, slow)
	if err != nil || fmt.Sprint(got) != "[3 4 5]" {
		t.Fatalf("slow reader got %v, %v; want its last three messages", got, err)
	}
	if fmt.Sprint(fastGot) != "[0 1 2 3 4 5]" {
		t.Fatalf("a reader that keeps up got %v; want every message", fastGot)
	}
	if slow.Dropped() != 3 || fast.Dropped() != 0 {
		t.Fatalf("dropped: slow %d, fast %d; want 3 and 0", slow.Dropped(), fast.Dropped())
	}
	fast.Leave()
	// Bytes bound the queue too: 6 bytes queued, a 6-byte message pushes
	// the first out whole; a message larger than the bound still fits alone.
	w.Publish(msg("abc"))
	w.Publish(msg("def"))
	w.Publish(msg("ghijkl"))
	if got, _ := take(t, slow); fmt.Sprint(got) != "[def ghijkl]" {
		t.Fatalf("after byte overflow got %v", got)
	}
	w.Publish(msg("0123456789ABCDEF"))
	if got, _ := take(t, slow); fmt.Sprint(got) != "[0123456789ABCDEF]" {
		t.Fatalf("an oversized message got %v", got)
	}
	if s := h.Stats(); len(s) != 1 || s[0].Dropped != 4 || s[0].Readers != 1 || s[0].Writers != 1 {
		t.Fatalf("stats %+v; want 4 dropped, 1 reader, 1 writer", s)
	}
}

func TestLaggingReaderIsCutOthersGoOn(t *testing.T) {
	c := &clock{now: time.Unix(1000, 0)}
	h := newTestHub(t, Config{MaxLag: time.Second, Now: c.Now})
	key := Key{"cam", "video"}
	slow, _ := h.Join(key, false)
	fast, _ := h.Join(key, false)
	w, _ := h.Write(key)
	w.Publish(msg("a"))
	take(t, fast)
	c.now = c.now.Add(1500 * time.Millisecond)
	w.Publish(msg("b"))
	if _, err := take(t, slow); !errors.Is(err, ErrLagging) {
		t.Fatalf("slow reader: %v; want ErrLagging", err)
	}
	if got, err := take(t, fast); err != nil || fmt.Sprint(got) != "[b]" {
		t.Fatalf("fast reader got %v, %v", got, err)
	}
	if s := h.Stats(); s[0].Cut != 1 || s[0].Readers != 1 {
		t.Fatalf("stats %+v; want one cut, one reader left", s[0])
	}
}

func TestBacklogGreetsNewReaders(t *testing.T) {
	h := newTestHub(t, Config{Backlog: 2})
	key := Key{"cam", "log"}
	w, _ := h.Write(key)
	for _, s := range []string{"a", "b", "c"} {
		w.Publish(msg(s))
	}
	r, _ := h.Join(key, false)
	w.Publish(msg("d"))
	if got, _ := take(t, r); fmt.Sprint(got) != "[b c d]" {
		t.Fatalf("new reader got %v; want the last two, then the next", got)
	}
}

func TestCloseDeviceEndsReadersAndWriters(t *testing.T) {
	h := newTestHub(t, Config{})
	r, _ := h.Join(Key{"cam", "video"}, false)
	w, _ := h.Write(Key{"cam", "audio"})
	other, _ := h.Join(Key{"arm", "video"}, false)
	if n := h.CloseDevice("cam", ErrCancelled); n != 2 {
		t.Fatalf("CloseDevice ended %d; want 2", n)
	}
	if _, err := take(t, r); !errors.Is(err, ErrCancelled) {
		t.Fatalf("reader: %v", err)
	}
	select {
	case <-w.Done():
	default:
		t.Fatal("writer not ended")
	}
	if _, err := take(t, other); err != nil {
		t.Fatalf("another device's reader: %v", err)
	}
	other.Leave()
	if s := h.Stats(); len(s) != 0 {
		t.Fatalf("topics left: %+v", s)
	}
}

func TestConfigRefusesBacklogBeyondQueue(t *testing.T) {
	if _, err := NewHub(Config{Backlog: 20, QueueMessages: 10}); err == nil {
		t.Fatal("a backlog larger than the queue was accepted")
	}
}

// fakeLink is a Link whose holder is another relay: Subscribe counts
// its calls and waits for ctx.
type fakeLink struct{ subscribes chan Key }

func (l fakeLink) Subscribe(ctx context.Context, key Key, connected func(), _ func(Message)) error {
	connected()
	l.subscribes <- key
	<-ctx.Done()
	return ctx.Err()
}

func (l fakeLink) Publish(context.Context, Key) (Sender, error) { return nil, ErrLocal }

func TestOneFeedPerTopicAndMovedFollowsTheDevice(t *testing.T) {
	link := fakeLink{subscribes: make(chan Key, 4)}
	h := newTestHub(t, Config{Link: link})
	key := Key{"cam", "video"}
	a, _ := h.Join(key, false)
	b, _ := h.Join(key, false)
	peer, _ := h.Join(key, true)
	w, _ := h.Write(key)
	<-link.subscribes
	select {
	case k := <-link.subscribes:
		t.Fatalf("a second feed for %v", k)
	default:
	}
	if n := h.Moved("cam"); n != 2 {
		t.Fatalf("Moved ended %d connections; want the relay's feed and the writer", n)
	}
	if _, err := take(t, peer); !errors.Is(err, ErrMoved) {
		t.Fatalf("another relay's feed: %v; want ErrMoved", err)
	}
	select {
	case <-w.Done():
	default:
		t.Fatal("the writer was not ended")
	}
	<-link.subscribes // the users' readers are fed anew
	if _, err := take(t, a); err != nil {
		t.Fatalf("a user's reader: %v", err)
	}
	a.Leave()
	b.Leave()
	if s := h.Stats(); len(s) != 0 {
		t.Fatalf("topics left: %+v", s)
	}
}
