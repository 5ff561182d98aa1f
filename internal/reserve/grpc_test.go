package reserve

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/internal/coord/sluicev1"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/storetest"
)

// TestServiceDesc checks the hand-written descriptor against the service
// of the compiled .proto.
func TestServiceDesc(t *testing.T) {
	fd := sluicev1.File_sluice_v1_ratelimit_proto
	if got := fd.Path(); got != serviceDesc.Metadata {
		t.Errorf("Metadata %q, want the .proto's path %q", serviceDesc.Metadata, got)
	}
	sd := fd.Services().ByName("RateLimitService")
	if sd == nil || string(sd.FullName()) != serviceDesc.ServiceName {
		t.Fatalf("the .proto has no service %s", serviceDesc.ServiceName)
	}
	if n := sd.Methods().Len(); n != len(serviceDesc.Methods) || len(serviceDesc.Streams) != 0 {
		t.Fatalf("%d methods and %d streams; the .proto has %d unary methods", len(serviceDesc.Methods), len(serviceDesc.Streams), n)
	}
	for _, m := range serviceDesc.Methods {
		md := sd.Methods().ByName(protoreflect.Name(m.MethodName))
		if md == nil || md.IsStreamingClient() || md.IsStreamingServer() {
			t.Fatalf("method %s is not a unary method of the .proto", m.MethodName)
		}
		if full := "/" + string(sd.FullName()) + "/" + m.MethodName; full != ReserveMethod && full != SettleMethod {
			t.Errorf("neither ReserveMethod %q nor SettleMethod %q names %s", ReserveMethod, SettleMethod, m.MethodName)
		}
		var decoded protoreflect.FullName
		dec := func(v any) error {
			decoded = v.(proto.Message).ProtoReflect().Descriptor().FullName()
			return status.Error(codes.Canceled, "stop")
		}
		_, _ = m.Handler(&Server{}, context.Background(), dec, nil)
		if decoded != md.Input().FullName() {
			t.Errorf("method %s decodes a %s, want %s", m.MethodName, decoded, md.Input().FullName())
		}
	}
}

const testRules = `domain: t
descriptors:
  - key: g
    rate_limit: {period: 1s, requests_per_unit: 2, burst: 4, name: gcra}
  - key: w
    rate_limit: {unit: second, requests_per_unit: 2, name: window}
  - key: model
    limits:
      - {period: 1s, requests_per_unit: 1000, name: requests}
      - {period: 1s, requests_per_unit: 100, cost_unit: input_tokens, name: input}
`

// dial serves the test rules on a memory store whose clock stands still
// unless the test moves it, and returns a caller of Reserve.
func dial(t *testing.T) (func(*sluicev1.ReserveRequest) (*sluicev1.ReserveResponse, error), *storetest.Clock) {
	call, clock, _ := dialSettle(t)
	return call, clock
}

// dialSettle is dial with a caller of Settle.
func dialSettle(t *testing.T) (func(*sluicev1.ReserveRequest) (*sluicev1.ReserveResponse, error), *storetest.Clock, func(*sluicev1.SettleRequest) (*sluicev1.SettleResponse, error)) {
	t.Helper()
	clock := storetest.NewClock(time.Unix(1_800_000_000, 0))
	mem := memstore.New(memstore.Options{JanitorInterval: -1, Now: clock.Now})
	t.Cleanup(func() { mem.Close() })
	d, err := rules.Parse("t.yaml", []byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.NewSet(d)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := service.New(service.Options{Store: mem, Ledger: mem, Rules: set})
	if err != nil {
		t.Fatal(err)
	}
	ln := bufconn.Listen(1 << 20)
	g := grpc.NewServer()
	New(svc).Register(g)
	go g.Serve(ln) //nolint:errcheck // ends with Stop
	t.Cleanup(g.Stop)
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	call := func(in *sluicev1.ReserveRequest) (*sluicev1.ReserveResponse, error) {
		out := new(sluicev1.ReserveResponse)
		return out, cc.Invoke(t.Context(), ReserveMethod, in, out)
	}
	settle := func(in *sluicev1.SettleRequest) (*sluicev1.SettleResponse, error) {
		out := new(sluicev1.SettleResponse)
		return out, cc.Invoke(t.Context(), SettleMethod, in, out)
	}
	return call, clock, settle
}

func req(key string, cost int64, maxWait *durationpb.Duration) *sluicev1.ReserveRequest {
	return &sluicev1.ReserveRequest{
		Domain:      "t",
		Descriptors: []*sluicev1.RateLimitDescriptor{{Entries: []*sluicev1.RateLimitEntry{{Key: key, Value: "a"}}}},
		Cost:        &cost,
		MaxWait:     maxWait,
	}
}

// TestReserve: at one instant on 2/s burst 4, the burst goes at once,
// then a unit waits 500ms; beyond max_wait, denied with retry_after, and
// nothing taken.
func TestReserve(t *testing.T) {
	call, clock := dial(t)
	sec := durationpb.New(time.Second)
	out, err := call(req("g", 4, sec))
	if err != nil || !out.Allowed || out.Wait.AsDuration() != 0 || out.Descriptors[0].GetRemaining() != 0 || out.Descriptors[0].Limit != 4 {
		t.Fatalf("the burst: %v, %v", out, err)
	}
	out, err = call(req("g", 1, sec))
	if err != nil || !out.Allowed || out.Wait.AsDuration() != 500*time.Millisecond || out.Descriptors[0].Wait.AsDuration() != 500*time.Millisecond {
		t.Fatalf("one more: %v, %v; want a wait of 500ms", out, err)
	}
	out, err = call(req("g", 2, sec))
	if err != nil || out.Allowed || out.Wait != nil || out.RetryAfter.AsDuration() != 500*time.Millisecond || out.Descriptors[0].Reason != "limited" {
		t.Fatalf("beyond max_wait: %v, %v; want denied, retry_after 500ms", out, err)
	}
	clock.Advance(250 * time.Millisecond)
	if out, err = call(req("g", 1, sec)); err != nil || out.Wait.AsDuration() != 750*time.Millisecond {
		t.Fatalf("250ms later: %v, %v; want a wait of 750ms", out, err)
	}
	if out, err = call(req("g", 5, sec)); err != nil || out.Allowed || out.RetryAfter != nil || out.Descriptors[0].Reason != "exceeds_capacity" {
		t.Fatalf("above the capacity: %v, %v; want denied, no retry_after", out, err)
	}
}

// TestReserveCosts: a descriptor's costs per unit (or the request's)
// reach the limits of their units: 100 input tokens per second, no
// burst: 150 at once exceed the capacity; 60 go at once, then 90 more
// wait 500ms. The answer names the unit that decided.
func TestReserveCosts(t *testing.T) {
	call, _ := dial(t)
	sec := durationpb.New(time.Second)
	in := req("model", 1, sec)
	in.Descriptors[0].Entries[0].Value = "m"
	in.Costs = map[string]int64{"input_tokens": 150}
	if out, err := call(in); err != nil || out.Allowed || out.Descriptors[0].Reason != "exceeds_capacity" || out.Descriptors[0].CostUnit != "input_tokens" {
		t.Fatalf("150 input tokens at once: %v, %v; want exceeds_capacity (above the capacity of 100)", out, err)
	}
	in.Costs = map[string]int64{"input_tokens": 60}
	out, err := call(in)
	if err != nil || !out.Allowed || out.Wait.AsDuration() != 0 || out.Descriptors[0].CostUnit != "input_tokens" || out.Descriptors[0].GetRemaining() != 40 {
		t.Fatalf("60 input tokens: %v, %v; want admitted at once, 40 left", out, err)
	}
	in.Costs, in.Descriptors[0].Costs = map[string]int64{"input_tokens": 1}, map[string]int64{"input_tokens": 90}
	if out, err = call(in); err != nil || !out.Allowed || out.Wait.AsDuration() != 500*time.Millisecond {
		t.Fatalf("90 more: %v, %v; want a wait of 500ms (the descriptor's costs, not the request's)", out, err)
	}
	in.Descriptors[0].Costs = map[string]int64{"Input": 1, "input_tokens": 1}
	if _, err = call(in); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `invalid cost unit "Input"`) {
		t.Errorf("a bad unit: %v; want INVALID_ARGUMENT naming it", err)
	}
	in.Descriptors[0].Costs = map[string]int64{"a": 1, "b": 1, "c": 1, "d": 1, "e": 1, "f": 1, "g": 1, "h": 1, "i": 1}
	if _, err = call(in); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "MaxCostUnits") {
		t.Errorf("9 units: %v; want INVALID_ARGUMENT naming MaxCostUnits", err)
	}
}

func TestReserveErrors(t *testing.T) {
	call, _ := dial(t)
	for _, tt := range []struct {
		in   *sluicev1.ReserveRequest
		want string
	}{
		{req("w", 1, durationpb.New(time.Second)), `limit "window" of domain "t" cannot be reserved`},
		{req("g", 1, nil), "max_wait is required"},
		{req("g", 1, durationpb.New(2*time.Minute)), "exceeds this server's bound"},
		{req("g", 1, durationpb.New(-time.Second)), "negative"},
		{&sluicev1.ReserveRequest{Domain: "t", MaxWait: durationpb.New(0)}, "no descriptors"},
	} {
		_, err := call(tt.in)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: %v; want INVALID_ARGUMENT containing %q", tt.in, err, tt.want)
		}
	}
}

// TestUndecodable: a request gRPC cannot decode (a string that is not
// UTF-8) is the caller's fault, INVALID_ARGUMENT, not INTERNAL.
func TestUndecodable(t *testing.T) {
	dec := func(any) error {
		return status.Error(codes.Internal, "grpc: failed to unmarshal the received message: string field contains invalid UTF-8")
	}
	_, err := serviceDesc.Methods[0].Handler(&Server{}, context.Background(), dec, nil)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "invalid UTF-8") {
		t.Errorf("undecodable request: %v; want INVALID_ARGUMENT with gRPC's message", err)
	}
}

// TestSettle: a reservation with settle answers an id; Settle refunds
// what the actual cost did not use, then answers already_settled; an
// unknown id is NOT_FOUND; malformed requests are INVALID_ARGUMENT.
func TestSettle(t *testing.T) {
	call, _, settle := dialSettle(t)
	in := req("g", 4, durationpb.New(time.Second))
	in.Settle, in.SettleWithin = true, durationpb.New(time.Minute)
	out, err := call(in)
	if err != nil || !out.Allowed || len(out.Reservation) != 22 {
		t.Fatalf("Reserve with settle: %v, %v", out, err)
	}
	one, minus := int64(1), int64(-1)
	got, err := settle(&sluicev1.SettleRequest{Reservation: out.Reservation, Descriptors: []*sluicev1.SettleDescriptor{{Cost: &one}}})
	if err != nil || !got.Settled || got.Refunded != 3 || got.Limits != 1 {
		t.Fatalf("Settle: %v, %v; want 3 refunded", got, err)
	}
	if got, err = settle(&sluicev1.SettleRequest{Reservation: out.Reservation, Cost: &one}); err != nil || !got.AlreadySettled || got.Settled {
		t.Fatalf("repeat: %v, %v", got, err)
	}
	if _, err = settle(&sluicev1.SettleRequest{Reservation: "AAAAAAAAAAAAAAAAAAAAAA", Cost: &one}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown: %v", err)
	}
	for _, bad := range []*sluicev1.SettleRequest{
		{Reservation: "AAAAAAAAAAAAAAAAAAAAAA"},
		{Reservation: "bad id", Cost: &one},
		{Reservation: "AAAAAAAAAAAAAAAAAAAAAA", Cost: &one, Descriptors: []*sluicev1.SettleDescriptor{{Cost: &one}}},
		{Reservation: "AAAAAAAAAAAAAAAAAAAAAA", Descriptors: []*sluicev1.SettleDescriptor{{Cost: &minus}}},
	} {
		if _, err := settle(bad); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v; want INVALID_ARGUMENT", bad, err)
		}
	}
	in = req("g", 0, durationpb.New(time.Second))
	in.SettleWithin = durationpb.New(time.Minute)
	if _, err := call(in); status.Code(err) != codes.InvalidArgument {
		t.Errorf("settle_within without settle: %v", err)
	}
}
