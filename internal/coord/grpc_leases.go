package coord

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/internal/coord/sluicev1"
	"github.com/sluicehq/sluice/lease"
)

// LeaseServiceName is the gRPC name of the lease service.
const LeaseServiceName = "sluice.v1.LeaseService"

// leaseServiceDesc is sluice.v1.LeaseService's descriptor, written by
// hand as serviceDesc is: three unary methods and Watch, a server stream.
// grpc_leases_test.go checks it against the compiled .proto.
var leaseServiceDesc = grpc.ServiceDesc{
	ServiceName: LeaseServiceName,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		unary(LeaseServiceName, "Join", (*Service).grpcJoin),
		unary(LeaseServiceName, "Demand", (*Service).grpcDemand),
		unary(LeaseServiceName, "Leave", (*Service).grpcLeave),
	},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Watch",
		Handler:       watchHandler,
		ServerStreams: true,
	}},
	Metadata: "sluice/v1/lease.proto",
}

// RegisterLeases registers s as sluice.v1.LeaseService on g.
func (s *Service) RegisterLeases(g grpc.ServiceRegistrar) { g.RegisterService(&leaseServiceDesc, s) }

// watchHandler serves Watch: it receives the request, checks the bearer
// token, and streams the grants (Service.Stream). The server's stream
// interceptors run around it.
func watchHandler(srv any, stream grpc.ServerStream) error {
	s := srv.(*Service)
	in := new(sluicev1.WatchRequest)
	if err := stream.RecvMsg(in); err != nil {
		return err
	}
	if !s.authorizedCall(stream.Context()) {
		return status.Error(codes.Unauthenticated, "a valid bearer token is required (metadata authorization: Bearer TOKEN)")
	}
	err := s.Stream(stream.Context(), in.GetService(), in.GetHolderId(), func(g LeaseGrant) error {
		return stream.SendMsg(&sluicev1.WatchResponse{Grant: grantMsg(g)})
	})
	if err != nil {
		return grpcError(err)
	}
	return nil
}

func (s *Service) grpcJoin(ctx context.Context, in *sluicev1.JoinRequest) (*sluicev1.JoinResponse, error) {
	req := JoinRequest{Service: in.GetService(), Capacity: in.GetCapacity(), Partitions: int(in.GetPartitions()),
		Weight: in.GetWeight(), Rate: in.GetRate(), Backlog: in.GetBacklog()}
	var err error
	if req.TTL, err = duration("ttl", in.GetTtl()); err != nil {
		return nil, err
	}
	if req.Window, err = duration("window", in.GetWindow()); err != nil {
		return nil, err
	}
	g, err := s.Join(ctx, req)
	if err != nil {
		return nil, grpcError(err)
	}
	return &sluicev1.JoinResponse{Grant: grantMsg(g)}, nil
}

func (s *Service) grpcDemand(ctx context.Context, in *sluicev1.DemandRequest) (*sluicev1.DemandResponse, error) {
	g, err := s.Demand(ctx, DemandRequest{Service: in.GetService(), HolderID: in.GetHolderId(),
		Rate: in.GetRate(), Backlog: in.GetBacklog(), Version: in.GetVersion()})
	if err != nil {
		return nil, grpcError(err)
	}
	return &sluicev1.DemandResponse{Grant: grantMsg(g)}, nil
}

func (s *Service) grpcLeave(ctx context.Context, in *sluicev1.LeaveRequest) (*sluicev1.LeaveResponse, error) {
	if err := s.Leave(ctx, in.GetService(), in.GetHolderId()); err != nil {
		return nil, grpcError(err)
	}
	return &sluicev1.LeaveResponse{}, nil
}

// grantMsg is the message of a grant.
func grantMsg(g LeaseGrant) *sluicev1.LeaseGrant {
	m := &sluicev1.LeaseGrant{HolderId: g.HolderID, Version: g.Version, Rate: g.Rate, PaceRate: g.PaceRate,
		Burst: int64(g.Burst), Window: durationpb.New(g.Window), ValidFor: durationpb.New(g.ValidFor)}
	for _, l := range g.Leases {
		m.Leases = append(m.Leases, &sluicev1.Lease{Partition: int32(l.Partition), Epoch: l.Epoch})
	}
	return m
}

// GrantFromMsg is the grant of a message (for clients and tests).
func GrantFromMsg(m *sluicev1.LeaseGrant) LeaseGrant {
	g := LeaseGrant{HolderID: m.GetHolderId(), Version: m.GetVersion(), Rate: m.GetRate(), PaceRate: m.GetPaceRate(),
		Burst: int(m.GetBurst()), Window: m.GetWindow().AsDuration(), ValidFor: m.GetValidFor().AsDuration()}
	for _, l := range m.GetLeases() {
		g.Leases = append(g.Leases, lease.Grant{Partition: int(l.GetPartition()), Epoch: l.GetEpoch()})
	}
	return g
}
