package main

import (
	"context"
	"fmt"
	"io"

	"github.com/sluicehq/sluice/memstore"
)

const serveUsage = `Usage: sluice serve

Serve runs Sluice's decision service with its embedded default: state in an
in-process memory store. It runs until SIGINT or SIGTERM, then exits 0.

The service itself (Envoy's rate limit API over gRPC and the JSON API) is not
built yet: for now serve only prepares the store and waits.
`

// runServe opens the embedded store and waits until ctx is done.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", serveUsage, stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	store := memstore.New(memstore.Options{})
	fmt.Fprintln(stdout, "sluice serve: in-process memory store ready; the decision service (gRPC and JSON APIs) is not built yet, so nothing is listening. Waiting for SIGINT or SIGTERM.")
	<-ctx.Done()
	if err := store.Close(); err != nil {
		return fmt.Errorf("serve: closing the memory store: %w", err)
	}
	fmt.Fprintln(stdout, "sluice serve: stopped")
	return nil
}
