package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// defaultClientTimeout bounds each call when Client.HTTPClient is nil.
const defaultClientTimeout = 30 * time.Second

// ErrUnreachable is wrapped when the operator API could not be reached at all.
var ErrUnreachable = errors.New("operator API unreachable")

// APIError is an error answer of the operator API.
type APIError struct {
	Status  int    // the HTTP status code
	Message string // the server's explanation
}

// Error says the status and the server's message.
func (e *APIError) Error() string {
	return fmt.Sprintf("%d %s: %s", e.Status, http.StatusText(e.Status), e.Message)
}

// Client calls the operator API of a relay.
type Client struct {
	// BaseURL is the relay's admin listener, e.g. http://127.0.0.1:9090.
	BaseURL string
	// Token is the admin token sent as a bearer token.
	Token string
	// HTTPClient makes the calls. Nil uses a client with a 30 s timeout.
	HTTPClient *http.Client
}

// CreateToken creates a token and returns it with its secret.
func (c *Client) CreateToken(ctx context.Context, req TokenRequest) (CreatedToken, error) {
	var out CreatedToken
	err := c.do(ctx, http.MethodPost, PathTokens, req, http.StatusCreated, &out)
	return out, err
}

// ListTokens returns every token, without secrets.
func (c *Client) ListTokens(ctx context.Context) ([]Token, error) {
	var out []Token
	err := c.do(ctx, http.MethodGet, PathTokens, nil, http.StatusOK, &out)
	return out, err
}

// RevokeToken revokes the token with the given id. An unknown id yields an
// *APIError with Status 404.
func (c *Client) RevokeToken(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, PathTokens+"/"+url.PathEscape(id), nil, http.StatusNoContent, nil)
}

// do sends one request and decodes a want-status answer into out (if not
// nil); any other status becomes an *APIError.
func (c *Client) do(ctx context.Context, method, path string, in any, want int, out any) error {
	req, err := c.newRequest(ctx, method, path, in)
	if err != nil {
		return err
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return fmt.Errorf("%w at %s: %w", ErrUnreachable, c.BaseURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		return apiError(resp.StatusCode, io.LimitReader(resp.Body, MaxBodyBytes))
	}
	if out == nil {
		return nil
	}
	body := &io.LimitedReader{R: resp.Body, N: MaxAnswerBytes}
	if err := json.NewDecoder(body).Decode(out); err != nil {
		if body.N <= 0 {
			return fmt.Errorf("%s %s: the answer is larger than the %d MiB this client reads", method, path, MaxAnswerBytes>>20)
		}
		return fmt.Errorf("%s %s: decoding the answer: %w", method, path, err)
	}
	return nil
}

func (c *Client) newRequest(ctx context.Context, method, path string, in any) (*http.Request, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.BaseURL, "/")+path, body)
	if err != nil {
		return nil, fmt.Errorf("operator API address %q: %w", c.BaseURL, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.Token)
	return req, nil
}

func (c *Client) httpClient() *http.Client {
	if c.HTTPClient != nil {
		return c.HTTPClient
	}
	return &http.Client{Timeout: defaultClientTimeout}
}

// apiError turns an error answer into an *APIError, with the server's JSON
// message or, failing that, the start of its body.
func apiError(status int, body io.Reader) error {
	raw, _ := io.ReadAll(body)
	var eb errorBody
	if err := json.Unmarshal(raw, &eb); err == nil && eb.Error != "" {
		return &APIError{Status: status, Message: eb.Error}
	}
	msg := strings.TrimSpace(string(raw))
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	if msg == "" {
		msg = "no explanation given"
	}
	return &APIError{Status: status, Message: msg}
}

// ListRelays returns every relay of the fleet, including those that stopped
// beating.
func (c *Client) ListRelays(ctx context.Context) ([]Relay, error) {
	var out []Relay
	err := c.do(ctx, http.MethodGet, PathRelays, nil, http.StatusOK, &out)
	return out, err
}

// SetRelayDraining drains (true, guarded) or undrains (false) the relay
// with the given id. An unknown id yields an *APIError with Status 404, a
// drain the guards refuse one with Status 409; see DrainRelay.
func (c *Client) SetRelayDraining(ctx context.Context, id string, draining bool) (DrainAnswer, error) {
	if draining {
		return c.DrainRelay(ctx, id, DrainRequest{})
	}
	var out DrainAnswer
	err := c.do(ctx, http.MethodPost, PathRelays+"/"+url.PathEscape(id)+"/undrain", nil, http.StatusOK, &out)
	return out, err
}

// DrainRelay drains the relay with the given id, guarded or, with
// req.Force, not. A drain the guards refuse (the last relay serving, no
// room on the others) yields an *APIError with Status 409 whose message
// says why and what to do.
func (c *Client) DrainRelay(ctx context.Context, id string, req DrainRequest) (DrainAnswer, error) {
	var out DrainAnswer
	err := c.do(ctx, http.MethodPost, PathRelays+"/"+url.PathEscape(id)+"/drain", req, http.StatusOK, &out)
	return out, err
}

// CheckDrain asks the drain guards whether the relay with the given id
// would be drained now, changing nothing: nil, or the *APIError 409 a
// drain would get.
func (c *Client) CheckDrain(ctx context.Context, id string) (DrainAnswer, error) {
	var out DrainAnswer
	err := c.do(ctx, http.MethodGet, PathRelays+"/"+url.PathEscape(id)+"/drain", nil, http.StatusOK, &out)
	return out, err
}

// ListDevices returns the device directory as an admin sees it.
func (c *Client) ListDevices(ctx context.Context) ([]Device, error) {
	var out []Device
	err := c.do(ctx, http.MethodGet, PathDevices, nil, http.StatusOK, &out)
	return out, err
}

// Device returns one device and the relay that holds it, as an admin sees
// them. An unknown name yields an *APIError with Status 404.
func (c *Client) Device(ctx context.Context, name string) (DeviceLink, error) {
	var out DeviceLink
	err := c.do(ctx, http.MethodGet, PathDevices+"/"+url.PathEscape(name), nil, http.StatusOK, &out)
	return out, err
}

// CancelDevice drops every session of the named device on every relay; its
// agents reconnect.
func (c *Client) CancelDevice(ctx context.Context, name string) (CancelAnswer, error) {
	var out CancelAnswer
	err := c.do(ctx, http.MethodPost, PathDevices+"/"+url.PathEscape(name)+"/cancel", nil, http.StatusOK, &out)
	return out, err
}

// Events returns the last limit events, oldest first.
func (c *Client) Events(ctx context.Context, limit int) ([]Event, error) {
	var out []Event
	err := c.do(ctx, http.MethodGet, PathEvents+"?limit="+strconv.Itoa(limit), nil, http.StatusOK, &out)
	return out, err
}

// FollowEvents calls fn with each event recorded from now on until ctx ends,
// the connection breaks or fn fails. It returns nil when ctx ends.
func (c *Client) FollowEvents(ctx context.Context, fn func(Event) error) error {
	req, err := c.newRequest(ctx, http.MethodGet, PathEvents+"?follow=1", nil)
	if err != nil {
		return err
	}
	hc := *c.httpClient()
	hc.Timeout = 0 // the stream lasts until ctx ends
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("%w at %s: %w", ErrUnreachable, c.BaseURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return apiError(resp.StatusCode, io.LimitReader(resp.Body, MaxBodyBytes))
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var e Event
		if err := dec.Decode(&e); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("following events: %w", err)
		}
		if err := fn(e); err != nil {
			return err
		}
	}
}

// Status returns the fleet summary of the relay answering.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var out Status
	err := c.do(ctx, http.MethodGet, PathStatus, nil, http.StatusOK, &out)
	return out, err
}

// RollInfo returns whether rolling is enabled and the roll in progress.
func (c *Client) RollInfo(ctx context.Context) (RollInfo, error) {
	var out RollInfo
	err := c.do(ctx, http.MethodGet, PathRoll, nil, http.StatusOK, &out)
	return out, err
}

// SetRollEnabled allows or forbids rolling updates for the fleet.
func (c *Client) SetRollEnabled(ctx context.Context, on bool) error {
	return c.do(ctx, http.MethodPut, PathRoll+"/enabled", RollSwitch{Enabled: on}, http.StatusOK, nil)
}

// SaveRoll records the roll in progress.
func (c *Client) SaveRoll(ctx context.Context, s RollState) error {
	return c.do(ctx, http.MethodPut, PathRoll+"/state", s, http.StatusNoContent, nil)
}

// ClearRoll forgets the roll in progress.
func (c *Client) ClearRoll(ctx context.Context) error {
	return c.do(ctx, http.MethodDelete, PathRoll+"/state", nil, http.StatusNoContent, nil)
}

// CreateCode asks for a single-use access code.
func (c *Client) CreateCode(ctx context.Context, req CodeRequest) (CreatedCode, error) {
	var out CreatedCode
	err := c.do(ctx, http.MethodPost, PathCodes, req, http.StatusCreated, &out)
	return out, err
}
