package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// measureWS opens a websocket to /ws and times cfg.WSRoundTrips echoes of a
// cfg.WSMessageBytes message.
func measureWS(ctx context.Context, e env, r *results) error {
	hc := newClient(1)
	defer hc.CloseIdleConnections()
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	url := "ws" + strings.TrimPrefix(e.t.base, "http") + "/ws"
	c, _, err := websocket.Dial(dctx, url, &websocket.DialOptions{
		HTTPClient:      hc,
		CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer c.CloseNow()
	msg := make([]byte, e.cfg.WSMessageBytes)
	op := func(ctx context.Context) error { return wsEchoOnce(ctx, c, msg) }
	samples, err := timeSeries(ctx, e.cfg.MaxSeries, min(e.cfg.Warmup, 50), e.cfg.WSRoundTrips, op)
	if err != nil {
		return err
	}
	r.raw.ws, r.raw.wsWant = append(r.raw.ws, samples...), r.raw.wsWant+e.cfg.WSRoundTrips
	r.WS = summarize(r.raw.ws, r.raw.wsWant)
	c.Close(websocket.StatusNormalClosure, "")
	return nil
}

// wsEchoOnce writes msg and reads it back.
func wsEchoOnce(ctx context.Context, c *websocket.Conn, msg []byte) error {
	if err := c.Write(ctx, websocket.MessageBinary, msg); err != nil {
		return fmt.Errorf("websocket write: %w", err)
	}
	_, got, err := c.Read(ctx)
	if err != nil {
		return fmt.Errorf("websocket read: %w", err)
	}
	if len(got) != len(msg) {
		return fmt.Errorf("websocket echo: got %d bytes, sent %d", len(got), len(msg))
	}
	return nil
}
