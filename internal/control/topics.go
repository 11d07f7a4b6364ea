package control

import (
	"context"
	"net/http"

	"github.com/switchboard-relay/switchboard/internal/topic"
)

// PathTopics lists the broadcast topics on the relay serving the call:
// their readers here, the relays fed from here, writers and messages lost.
const PathTopics = "/api/v1/topics"

// routeTopics adds the topics endpoint.
func (h *handler) routeTopics(mux *http.ServeMux) {
	mux.Handle("GET "+PathTopics, h.admin(h.listTopics))
}

func (h *handler) listTopics(w http.ResponseWriter, _ *http.Request) {
	list := []topic.Stats{}
	if h.cfg.Topics != nil {
		list = append(list, h.cfg.Topics()...)
	}
	writeJSON(w, http.StatusOK, list)
}

// ListTopics returns the topics on the relay the client talks to.
func (c *Client) ListTopics(ctx context.Context) ([]topic.Stats, error) {
	var out []topic.Stats
	err := c.do(ctx, http.MethodGet, PathTopics, nil, http.StatusOK, &out)
	return out, err
}
