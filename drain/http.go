package drain

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/limitheader"
)

// IdempotencyKeyHeader is the header field in which HTTPSink sends a
// message's key.
const IdempotencyKeyHeader = "Idempotency-Key"

// HeaderTenant is the header field that carries a message's tenant:
// HTTPSink sends it, and the JetStream Source (package drain/jsdrain)
// reads it from a queued message, where its Publish puts it.
const HeaderTenant = "Sluice-Tenant"

// HeaderPartition is the header field that carries a message's
// partition, as HeaderTenant carries its tenant.
const HeaderPartition = "Sluice-Partition"

// HTTPSink sends each message's data as the body of a request to URL,
// with the message's key in the Idempotency-Key header field, its
// tenant in Sluice-Tenant and its partition in Sluice-Partition. A 2xx answer is a success; 429 and 503 are
// throttling, with the wait their Retry-After (or RateLimit, or the
// vendor forms limitheader.RetryDelay reads) asks for; anything else, or
// an error of the transport, is a failure.
//
// The sink only classifies the answer: it neither pauses nor retries. The
// Drainer acts on a throttled answer, once: it pauses every worker for
// the wait asked and puts the message back with that delay. (An
// httplimit.Client here would pause this host's calls a second time, and
// its pause is not the Drainer's to end; pace with the Drainer's Limiter.)
type HTTPSink struct {
	URL string
	// Method is the request's method; "" means POST.
	Method string
	// ContentType is the body's; "" means application/octet-stream.
	ContentType string
	// HTTP sends the requests; nil means a client that keeps
	// 2·DefaultWorkers idle connections per host.
	HTTP *http.Client
}

// defaultHTTP is the default client: enough idle connections kept for
// the Drainer's workers (net/http's default keeps two per host, so 64
// workers would open and close connections all the time).
var defaultHTTP = func() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 2 * DefaultWorkers
	return &http.Client{Transport: tr}
}()

// Send is a Sink.
func (s *HTTPSink) Send(ctx context.Context, m Message) error {
	method := s.Method
	if method == "" {
		method = http.MethodPost
	}
	req, err := http.NewRequestWithContext(ctx, method, s.URL, bytes.NewReader(m.Data()))
	if err != nil {
		return err
	}
	ct := s.ContentType
	if ct == "" {
		ct = "application/octet-stream"
	}
	req.Header.Set("Content-Type", ct)
	req.Header.Set(IdempotencyKeyHeader, m.Key())
	if t := m.Tenant(); t != "" {
		req.Header.Set(HeaderTenant, t)
	}
	if p := m.Partition(); p != "" {
		req.Header.Set(HeaderPartition, p)
	}
	c := s.HTTP
	if c == nil {
		c = defaultHTTP
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_, _ = io.CopyN(io.Discard, resp.Body, 64<<10) // let the connection be reused
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return nil
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
		after, _ := limitheader.RetryDelay(resp.Header, time.Now())
		return Throttle(after, fmt.Errorf("%s %s: %s", method, s.URL, resp.Status))
	default:
		return fmt.Errorf("%s %s: %s: %q", method, s.URL, resp.Status, bytes.TrimSpace(body))
	}
}
