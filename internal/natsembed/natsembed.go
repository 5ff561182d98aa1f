// Package natsembed starts a NATS server with JetStream inside the
// process: sluice drain's embedded default and the tests' server
// (internal/natstest). It is the one place that configures one.
package natsembed

import (
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// StartTimeout bounds how long a server may take to accept clients.
const StartTimeout = 30 * time.Second

// Start starts a JetStream server storing its data (file storage) in
// dir, listening on host:port (port -1 for a free one), and waits until
// it accepts clients. The caller shuts it down (Shutdown, then
// WaitForShutdown).
func Start(dir, host string, port int) (*server.Server, error) {
	s, err := server.NewServer(&server.Options{
		ServerName: "sluice",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		NoSigs:     true,
		NoLog:      true,
	})
	if err != nil {
		return nil, fmt.Errorf("natsembed: %w", err)
	}
	s.Start()
	if !s.ReadyForConnections(StartTimeout) {
		s.Shutdown()
		return nil, fmt.Errorf("natsembed: server on %s:%d not ready within %v", host, port, StartTimeout)
	}
	return s, nil
}
