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
	body := io.LimitReader(resp.Body, MaxBodyBytes)
	if resp.StatusCode != want {
		return apiError(resp.StatusCode, body)
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(body).Decode(out); err != nil {
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
