package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/topic"
)

// runTopics runs 'switchboard ctl topics': the broadcast topics on the
// relay the admin URL names.
func runTopics(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	return listCommand(ctx, g, "ctl topics", args, stdout, stderr, (*control.Client).ListTopics, writeTopicTable)
}

func writeTopicTable(w io.Writer, topics []topic.Stats, _ time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tTOPIC\tREADERS\tRELAYS_FED\tWRITERS\tFROM_HOLDER\tMESSAGES\tDELIVERED\tDROPPED\tCUT")
	for _, s := range topics {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%v\t%d\t%d\t%d\t%d\n", s.Device, s.Name, s.Readers, s.RelayReaders, s.Writers,
			s.Fed, s.Published, s.Delivered, s.Dropped, s.Cut)
	}
	return tw.Flush()
}
