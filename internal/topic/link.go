package topic

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/coder/websocket"
)

// PeerLink is a Link over websockets to the relay holding a device,
// signed as the relays' forwards are.
type PeerLink struct {
	// Holder returns the relay holding device: its id and advertised URL,
	// or self when it is this relay; ok is false when no relay can.
	Holder func(device string) (id, address string, self, ok bool)
	// Sign signs h for a connection about device to the relay id.
	Sign func(h http.Header, device, relayID string)
	// Client dials the relays (its transport carries the TLS settings).
	Client *http.Client
	// MaxMessageBytes bounds the messages read from the holder.
	MaxMessageBytes int
}

var _ Link = (*PeerLink)(nil)

// errNoHolder means no relay can hold the device now.
var errNoHolder = errors.New("no relay is available for the device")

func (l *PeerLink) dial(ctx context.Context, key Key, mode Mode) (*websocket.Conn, error) {
	id, address, self, ok := l.Holder(key.Device)
	switch {
	case !ok:
		return nil, errNoHolder
	case self:
		return nil, ErrLocal
	}
	u := strings.TrimSuffix(address, "/") + Prefix + url.PathEscape(key.Device) + "/" + url.PathEscape(key.Name) + "?" + ModeParam + "=" + mode.String()
	h := http.Header{}
	l.Sign(h, key.Device, id)
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: l.Client, HTTPHeader: h, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("relay %s answered %s", id, resp.Status)
		}
		return nil, fmt.Errorf("reach relay %s: %w", id, err)
	}
	c.SetReadLimit(int64(l.MaxMessageBytes))
	return c, nil
}

// Subscribe implements Link.
func (l *PeerLink) Subscribe(ctx context.Context, key Key, connected func(), deliver func(Message)) error {
	c, err := l.dial(ctx, key, Read)
	if err != nil {
		return err
	}
	defer c.CloseNow()
	connected()
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			return err
		}
		deliver(Message{Binary: typ == websocket.MessageBinary, Data: data})
	}
}

// Publish implements Link.
func (l *PeerLink) Publish(ctx context.Context, key Key) (Sender, error) {
	c, err := l.dial(ctx, key, Write)
	if err != nil {
		return nil, err
	}
	// The holder sends nothing to a writer but its close: reading that
	// ends Done.
	s := &peerSender{c: c, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		_, _, s.err = c.Read(context.Background())
	}()
	return s, nil
}

// peerSender is a writer's connection to the holder. Its reading
// goroutine ends with the connection; Close waits for it.
type peerSender struct {
	c    *websocket.Conn
	done chan struct{}
	err  error // how the holder ended the connection; set before done is closed
}

func (s *peerSender) Send(ctx context.Context, m Message) error {
	typ := websocket.MessageText
	if m.Binary {
		typ = websocket.MessageBinary
	}
	return s.c.Write(ctx, typ, m.Data)
}

func (s *peerSender) Done() <-chan struct{} { return s.done }

// Err says why the holder ended the connection: ErrCancelled when the
// device's sessions were cancelled there.
func (s *peerSender) Err() error {
	<-s.done
	if websocket.CloseStatus(s.err) == websocket.StatusPolicyViolation {
		return fmt.Errorf("%w (at the relay holding the device): %v", ErrCancelled, s.err)
	}
	return fmt.Errorf("%w: %v", errHolderGone, s.err)
}

func (s *peerSender) Close() error {
	err := s.c.Close(websocket.StatusNormalClosure, "")
	<-s.done
	return err
}
