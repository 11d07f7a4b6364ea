// Command switchboard runs a relay node, a device agent or the operator CLI.
package main

import (
	"context"
	"os"

	"github.com/switchboard-relay/switchboard/internal/cli"
)

func main() {
	os.Exit(cli.Run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
