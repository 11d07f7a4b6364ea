package cli

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"github.com/switchboard-relay/switchboard/internal/control"
)

func runCodes(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "create" {
		return usageErrorf("ctl codes: use 'ctl codes create DEVICE [--path P] [--ttl D] [--url BASE]'")
	}
	fs := newFlagSet("ctl codes create", stderr)
	g.register(fs)
	path := fs.String("path", "/", "the `path` under the device that the code (and the browser session it opens) is good for, and below")
	ttl := fs.Duration("ttl", 30*time.Second, "how `long` the code lives, 1s to 60s")
	base := fs.String("url", "", "a relay's public `URL`; prints the whole link to open instead of the code alone")
	devices, err := parseWithArgs(fs, args[1:])
	if err != nil {
		return err
	}
	if len(devices) != 1 {
		return usageErrorf("ctl codes create: give exactly one device, got %d", len(devices))
	}
	if *ttl%time.Second != 0 || *ttl < time.Second || *ttl > time.Minute {
		return usageErrorf("ctl codes create: --ttl %s: give whole seconds from 1s to 60s", *ttl)
	}
	var link *url.URL
	if *base != "" {
		if link, err = url.Parse(*base); err != nil || (link.Scheme != "http" && link.Scheme != "https") || link.Host == "" {
			return usageErrorf("ctl codes create: --url %q is not an http:// or https:// URL", *base)
		}
	}
	if err := g.validate(); err != nil {
		return err
	}
	c, err := g.client()
	if err != nil {
		return err
	}
	created, err := c.CreateCode(ctx, control.CodeRequest{Device: devices[0], Path: *path, TTLSeconds: int(*ttl / time.Second)})
	if err != nil {
		return fmt.Errorf("ctl codes create: %w", g.explain(err))
	}
	full := ""
	if link != nil {
		full = strings.TrimSuffix(link.String(), "/") + created.URLPath
	}
	if g.output == outputJSON {
		return writeJSON(stdout, struct {
			control.CreatedCode
			URL string `json:"url,omitempty"`
		}{created, full})
	}
	if full != "" {
		fmt.Fprintln(stdout, full)
		return nil
	}
	fmt.Fprintln(stdout, created.Code)
	return nil
}
