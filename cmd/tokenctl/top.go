package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// topKeyJSON is one key of `top -o json`.
type topKeyJSON struct {
	Key   string `json:"key"`
	Count int64  `json:"count"`
	Error int64  `json:"error"`
}

// topJSON is `top -o json`: keys hottest first, every field present.
type topJSON struct {
	Rule         string       `json:"rule"`
	Window       string       `json:"window"`
	Denied       bool         `json:"denied"`
	Keys         []topKeyJSON `json:"keys"`
	Floor        int64        `json:"floor"`
	Total        int64        `json:"total"`
	MissingNodes []string     `json:"missingNodes"`
}

func newTopCmd(a *app) *cobra.Command {
	var (
		n      int32
		denied bool
		window string
		watch  bool
		every  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "top RULE",
		Short: "Print a rule's hottest keys, merged over every node",
		Long: `Print a rule's hottest keys by admitted permits (or, with --denied, by
denied permits) over the last minute or hour, merged over every node's
sketch. Each count is an upper bound: the true count lies in
[count - error, count], and every key whose true count is above the
floor is listed. Nodes that did not answer are named on stderr.

With --watch, the list is printed again every --interval until the
command is interrupted (--timeout bounds each call, not the watch).`,
		Example: `  tokenctl top api
  tokenctl top api -n 5 --denied --window hour
  tokenctl top api --watch -o json`,
		Args: argNames("RULE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &pb.TopKeysRequest{Rule: args[0], N: n, Denied: denied}
			switch window {
			case "minute":
				req.Window = pb.TopKeysWindow_MINUTE
			case "hour":
				req.Window = pb.TopKeysWindow_HOUR
			default:
				return usagef("--window must be minute or hour, got %q", window)
			}
			if n < 0 {
				return usagef("-n must be >= 0, got %d", n)
			}
			if every <= 0 {
				return usagef("--interval must be > 0, got %v", every)
			}
			_, admin, done, err := a.clients()
			if err != nil {
				return err
			}
			defer done()
			for {
				ctx, cancel := a.context(cmd, 0)
				var resp *pb.TopKeysResponse
				err := a.call(ctx, fmt.Sprintf("top keys of rule %q", args[0]), func(ctx context.Context) (err error) {
					resp, err = admin.TopKeys(ctx, req)
					return err
				})
				cancel()
				if err != nil {
					return err
				}
				if err := a.writeTop(args[0], window, denied, resp); err != nil {
					return err
				}
				if !watch {
					return nil
				}
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(every):
				}
			}
		},
	}
	f := cmd.Flags()
	f.Int32VarP(&n, "n", "n", 20, "most keys to print (at most 1000)")
	f.BoolVar(&denied, "denied", false, "rank by denied permits instead of admitted")
	f.StringVar(&window, "window", "minute", "how far back: minute or hour")
	f.BoolVar(&watch, "watch", false, "print again every --interval until interrupted")
	f.DurationVar(&every, "interval", 2*time.Second, "how often --watch prints")
	return cmd
}

// writeTop prints one answer of TopKeys.
func (a *app) writeTop(rule, window string, denied bool, resp *pb.TopKeysResponse) error {
	if len(resp.GetMissingNodes()) > 0 {
		a.logf("nodes that did not answer (their counts are left out): %v", resp.GetMissingNodes())
	}
	if a.structured() {
		out := topJSON{Rule: rule, Window: window, Denied: denied, Keys: make([]topKeyJSON, len(resp.GetKeys())),
			Floor: resp.GetFloor(), Total: resp.GetTotal(), MissingNodes: resp.GetMissingNodes()}
		if out.MissingNodes == nil {
			out.MissingNodes = []string{}
		}
		for i, k := range resp.GetKeys() {
			out.Keys[i] = topKeyJSON{Key: k.GetKey(), Count: k.GetCount(), Error: k.GetError()}
		}
		return a.writeLine(out)
	}
	side := "admitted"
	if denied {
		side = "denied"
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "KEY\t%s PERMITS\t± ERROR\n", map[string]string{"admitted": "ADMITTED", "denied": "DENIED"}[side])
	for _, k := range resp.GetKeys() {
		fmt.Fprintf(tw, "%s\t%d\t%d\n", k.GetKey(), k.GetCount(), k.GetError())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(a.stdout, "rule %s, last %s: %d %s permits in total; every key above %d is listed\n", rule, window, resp.GetTotal(), side, resp.GetFloor())
	return err
}
