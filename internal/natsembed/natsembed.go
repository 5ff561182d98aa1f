// Package natsembed starts a NATS server with JetStream inside the
// process: sluice drain's embedded default and the tests' server
// (internal/natstest). It is the one place that configures one.
package natsembed

import (
	"fmt"
	"net/url"
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
	return start(&server.Options{ServerName: "sluice", Host: host, Port: port}, dir)
}

// A Node is one server of a JetStream cluster (the fault scenarios'
// three-node cluster): the cluster's name, the same on every node, this
// server's name, unique in it and kept across restarts (its Raft
// identity, with its storage), where it listens for the other nodes'
// routes, and their route addresses (host:port).
type Node struct {
	Cluster, Name string
	RouteHost     string
	RoutePort     int
	Routes        []string
}

// StartNode is Start for a node of a cluster: it waits until the node
// accepts clients, not until the cluster has formed (its JetStream
// answers once a quorum of nodes reach each other).
func StartNode(dir, host string, port int, n Node) (*server.Server, error) {
	o := &server.Options{ServerName: n.Name, Host: host, Port: port,
		Cluster: server.ClusterOpts{Name: n.Cluster, Host: n.RouteHost, Port: n.RoutePort}}
	for _, r := range n.Routes {
		o.Routes = append(o.Routes, &url.URL{Scheme: "nats-route", Host: r})
	}
	return start(o, dir)
}

// start completes o as every server here is configured and starts it.
func start(o *server.Options, dir string) (*server.Server, error) {
	o.JetStream, o.StoreDir, o.NoSigs, o.NoLog = true, dir, true, true
	s, err := server.NewServer(o)
	if err != nil {
		return nil, fmt.Errorf("natsembed: %w", err)
	}
	s.Start()
	if !s.ReadyForConnections(StartTimeout) {
		s.Shutdown()
		return nil, fmt.Errorf("natsembed: server on %s:%d not ready within %v", o.Host, o.Port, StartTimeout)
	}
	return s, nil
}
