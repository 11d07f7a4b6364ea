package fleettest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/topic"
)

// topicURL is the websocket URL of a device's topic on relay r.
func topicURL(r *Relay, device, name, query string) string {
	u := "ws" + strings.TrimPrefix(r.URL, "http") + "/topic/" + device + "/" + name
	if query != "" {
		u += "?" + query
	}
	return u
}

// dialTopic opens a topic with the bearer token tok (none if empty) and
// closes it when the test ends.
func dialTopic(t *testing.T, url, tok string) *websocket.Conn {
	t.Helper()
	c, status, err := tryTopic(url, tok)
	if err != nil {
		t.Fatalf("dial %s: %d %v", url, status, err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c
}

// tryTopic opens a topic and returns the HTTP status of a refusal.
func tryTopic(url, tok string) (*websocket.Conn, int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h := http.Header{}
	if tok != "" {
		h.Set("Authorization", "Bearer "+tok)
	}
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		return nil, status, err
	}
	c.SetReadLimit(2 << 20)
	return c, http.StatusSwitchingProtocols, nil
}

// topicOf returns the stats of device's topic name on r.
func topicOf(r *Relay, device, name string) (topic.Stats, bool) {
	for _, s := range r.Node.Topics() {
		if s.Device == device && s.Name == name {
			return s, true
		}
	}
	return topic.Stats{}, false
}

// waitTopicReaders waits until r has users readers of the topic here.
func waitTopicReaders(t *testing.T, r *Relay, device, name string, users int, fed bool) {
	t.Helper()
	Eventually(t, 10*time.Second, func() error {
		s, _ := topicOf(r, device, name)
		if s.Readers != users || (fed && !s.Fed) {
			return fmt.Errorf("%s: %d readers (fed %v); want %d (fed %v)", r.Node.Fleet().ID(), s.Readers, s.Fed, users, fed)
		}
		return nil
	})
}

func TestTopicAgentTokenWritesUsersRead(t *testing.T) {
	r := StartRelay(t)
	agentTok := r.Token(t, auth.KindAgent, "cam-agent", "cam")
	userTok := r.Token(t, auth.KindUser, "viewer", "cam")
	otherTok := r.Token(t, auth.KindUser, "stranger", "arm")
	readers := []*websocket.Conn{dialTopic(t, topicURL(r, "cam", "video", ""), userTok), dialTopic(t, topicURL(r, "cam", "video", ""), userTok)}
	waitTopicReaders(t, r, "cam", "video", 2, false)
	w := dialTopic(t, topicURL(r, "cam", "video", "mode=write"), agentTok)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sizes := []int{1, 1 << 20, 100, 32 << 10, 1}
	for i, n := range sizes {
		if err := w.Write(ctx, websocket.MessageBinary, bytes.Repeat([]byte{byte(i)}, n)); err != nil {
			t.Fatal(err)
		}
	}
	for k, c := range readers {
		for i, n := range sizes {
			_, data, err := c.Read(ctx)
			if err != nil || len(data) != n || (n > 0 && data[0] != byte(i)) {
				t.Fatalf("reader %d, message %d: %d bytes, %v; want %d", k, i, len(data), err, n)
			}
		}
	}
	for _, tc := range []struct {
		name, url, tok string
		status         int
	}{
		{"no credential", topicURL(r, "cam", "video", ""), "", http.StatusUnauthorized},
		{"a bad token", topicURL(r, "cam", "video", ""), "sbu_00000000_nope", http.StatusUnauthorized},
		{"another device's user", topicURL(r, "cam", "video", ""), otherTok, http.StatusForbidden},
		{"another device's agent", topicURL(r, "arm", "video", "mode=write"), agentTok, http.StatusForbidden},
	} {
		if c, status, _ := tryTopic(tc.url, tc.tok); status != tc.status {
			if c != nil {
				c.CloseNow()
			}
			t.Errorf("%s: status %d; want %d", tc.name, status, tc.status)
		}
	}
}

func TestTopicAccessCodeScopesReadAndWrite(t *testing.T) {
	r := StartRelay(t)
	_, tok, err := r.Node.Tokens().Create(t.Context(), auth.CreateRequest{Kind: auth.KindUser, Name: "lab", Devices: []string{"cam"}})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := r.Node.Tokens().Principal(tok.ID)
	code := func(scope string) string {
		c, _, err := r.Node.IssueCode(p, "cam", scope, 0)
		if err != nil {
			t.Fatal(err)
		}
		return "code=" + c
	}
	readCode := code(node.TopicScope("video", "read"))
	reader := dialTopic(t, topicURL(r, "cam", "video", readCode), "")
	if _, status, _ := tryTopic(topicURL(r, "cam", "video", readCode), ""); status != http.StatusUnauthorized {
		t.Errorf("a code used twice: status %d; want 401", status)
	}
	if _, status, _ := tryTopic(topicURL(r, "cam", "video", "mode=write&"+code(node.TopicScope("video", "read"))), ""); status != http.StatusForbidden {
		t.Errorf("a read code writing: status %d; want 403", status)
	}
	if _, status, _ := tryTopic(topicURL(r, "cam", "audio", code(node.TopicScope("video", "read"))), ""); status != http.StatusForbidden {
		t.Errorf("a code for another topic: status %d; want 403", status)
	}
	waitTopicReaders(t, r, "cam", "video", 1, false)
	w := dialTopic(t, topicURL(r, "cam", "video", "mode=readwrite&"+code("/")), "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.Write(ctx, websocket.MessageText, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*websocket.Conn{reader, w} {
		if _, data, err := c.Read(ctx); err != nil || string(data) != "hello" {
			t.Fatalf("read %q, %v", data, err)
		}
	}
}

// TestTopicOneCopyPerRelay has readers on three relays that do not hold
// the device, two each, and a writer on yet another relay: the holder
// sends each message three times (once per relay), not six.
func TestTopicOneCopyPerRelay(t *testing.T) {
	relays := StartFleet(t, 4)
	holder, others := HolderFor(t, relays, "cam")
	userTok := FleetToken(t, relays, auth.KindUser, "viewer", "cam")
	agentTok := FleetToken(t, relays, auth.KindAgent, "cam-agent", "cam")
	var readers []*websocket.Conn
	for _, r := range others {
		for range 2 {
			readers = append(readers, dialTopic(t, topicURL(r, "cam", "video", ""), userTok))
		}
	}
	for _, r := range others {
		waitTopicReaders(t, r, "cam", "video", 2, true)
	}
	w := dialTopic(t, topicURL(others[0], "cam", "video", "mode=write"), agentTok)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	const count, size = 20, 32 << 10
	for i := range count {
		if err := w.Write(ctx, websocket.MessageBinary, bytes.Repeat([]byte{byte(i)}, size)); err != nil {
			t.Fatal(err)
		}
	}
	for k, c := range readers {
		for i := range count {
			_, data, err := c.Read(ctx)
			if err != nil || len(data) != size || data[0] != byte(i) {
				t.Fatalf("reader %d, message %d: %d bytes, %v", k, i, len(data), err)
			}
		}
	}
	s, _ := topicOf(holder, "cam", "video")
	if s.RelayReaders != 3 || s.Readers != 0 || s.Writers != 1 {
		t.Fatalf("holder: %+v; want 3 relays reading, 1 writer", s)
	}
	if want := int64(3 * count * size); s.RelayBytes != want || s.PublishedBytes != count*size {
		t.Fatalf("holder sent %d bytes to other relays for %d published; want %d (one copy per relay)", s.RelayBytes, s.PublishedBytes, want)
	}
	// The operator sees the same on the holder: the API ctl reads, the
	// metrics and the admin page.
	c := &control.Client{BaseURL: holder.AdminURL, Token: holder.AdminToken}
	listed, err := c.ListTopics(ctx)
	if err != nil || len(listed) != 1 || listed[0].RelayReaders != 3 {
		t.Fatalf("ListTopics: %+v, %v", listed, err)
	}
	metrics := adminGet(t, holder, "/metrics")
	if want := fmt.Sprintf("switchboard_topic_bytes_total{direction=\"to_relays\"} %g", float64(3*count*size)); !strings.Contains(metrics, want) {
		t.Fatalf("metrics lack %q", want)
	}
	if page := adminGet(t, holder, control.PathAdmin); !strings.Contains(page, `data-topic="cam/video"`) {
		t.Fatal("the admin page does not list the topic")
	}
}

// adminGet GETs path on r's admin listener with its admin token.
func adminGet(t *testing.T, r *Relay, path string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, r.AdminURL+path, nil)
	req.Header.Set("Authorization", "Bearer "+r.AdminToken)
	resp, err := NewClient(t, false).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", path, resp.Status)
	}
	return string(b)
}

// TestTopicRevokeAndCancelEndEveryRelay: revoking a reader's token ends
// its readers on every relay; cancelling the device's sessions ends the
// rest, writers included.
func TestTopicRevokeAndCancelEndEveryRelay(t *testing.T) {
	relays := StartFleet(t, 3)
	_, others := HolderFor(t, relays, "cam")
	revokedTok := FleetToken(t, relays, auth.KindUser, "leaver", "cam")
	keptTok := FleetToken(t, relays, auth.KindUser, "stayer", "cam")
	agentTok := FleetToken(t, relays, auth.KindAgent, "cam-agent", "cam")
	var revoked, kept []*websocket.Conn
	for _, r := range relays {
		revoked = append(revoked, dialTopic(t, topicURL(r, "cam", "video", ""), revokedTok))
		kept = append(kept, dialTopic(t, topicURL(r, "cam", "video", ""), keptTok))
	}
	for _, r := range relays {
		waitTopicReaders(t, r, "cam", "video", 2, false)
	}
	w := dialTopic(t, topicURL(others[0], "cam", "video", "mode=write"), agentTok)
	p, err := relays[0].Node.Tokens().Authenticate(revokedTok)
	if err != nil {
		t.Fatal(err)
	}
	if err := relays[0].Node.Tokens().Revoke(t.Context(), p.TokenID); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, c := range revoked {
		if _, _, err := c.Read(ctx); err == nil {
			t.Fatalf("a revoked reader on relay %d read on", i)
		}
	}
	for _, r := range relays {
		waitTopicReaders(t, r, "cam", "video", 1, false)
	}
	if err := relays[1].Node.Fleet().CancelDevice(t.Context(), "cam", "test"); err != nil {
		t.Fatal(err)
	}
	for i, c := range append(kept, w) {
		_, _, err := c.Read(ctx)
		if s := websocket.CloseStatus(err); s != websocket.StatusPolicyViolation {
			t.Fatalf("connection %d after the cancel: %v (status %d); want close 1008", i, err, s)
		}
	}
}

// TestTopicThrottledReaderDropsOthersGetEverything: a reader that stops
// reading loses whole messages, counted on the relay; the writer and two
// readers that keep up see every message.
func TestTopicThrottledReaderDropsOthersGetEverything(t *testing.T) {
	r := StartRelay(t, func(c *node.Config) { c.Topics = topic.Config{QueueMessages: 4, MaxLag: -1} })
	tok := r.Token(t, auth.KindUser, "viewer", "cam")
	stuck := dialTopic(t, topicURL(r, "cam", "video", ""), tok) // never reads
	fast := []*websocket.Conn{dialTopic(t, topicURL(r, "cam", "video", ""), tok), dialTopic(t, topicURL(r, "cam", "video", ""), tok)}
	waitTopicReaders(t, r, "cam", "video", 3, false)
	w := dialTopic(t, topicURL(r, "cam", "video", "mode=write"), tok)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const count, size = 300, 64 << 10
	for i := range count {
		payload := bytes.Repeat([]byte{byte(i)}, size)
		if err := w.Write(ctx, websocket.MessageBinary, payload); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		for k, c := range fast {
			if _, data, err := c.Read(ctx); err != nil || !bytes.Equal(data, payload) {
				t.Fatalf("reader %d, message %d: %d bytes, %v", k, i, len(data), err)
			}
		}
	}
	s, _ := topicOf(r, "cam", "video")
	if s.Dropped == 0 || s.Delivered < 2*count {
		t.Fatalf("%+v: want drops for the reader that stopped, every message for the others", s)
	}
	if m := adminGet(t, r, "/metrics"); !strings.Contains(m, fmt.Sprintf(`switchboard_topic_dropped_messages_total{device="cam",topic="video"} %d`, s.Dropped)) {
		t.Fatalf("the metrics do not count the %d messages lost", s.Dropped)
	}
	stuck.CloseNow()
}
