// Package throttledtest holds test conveniences for clients of throttled
// services: HandlerTransport runs a client and a server (a simulated
// database of package httplimit/rudb, or any handler) in one goroutine,
// without a network, so that they can run together under testing/synctest;
// Provider is a throttled LLM-like API, with token buckets on requests,
// input and output tokens, that announces its budgets in OpenAI's or
// Anthropic's header fields, for clients that pace to announced budgets.
//
// It is test code (it imports net/http/httptest); the simulated database
// itself is package rudb, which programs such as `sluice demo` link.
package throttledtest

import (
	"net/http"
	"net/http/httptest"
)

// HandlerTransport is an http.RoundTripper that serves requests with a
// handler in the calling goroutine, without a network, so that a client
// and a server can run together under testing/synctest.
type HandlerTransport struct{ Handler http.Handler }

func (t HandlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := req.Context().Err(); err != nil {
		return nil, err
	}
	// The server side sees what a server would: a body, never nil.
	sreq := req.Clone(req.Context())
	if sreq.Body == nil {
		sreq.Body = http.NoBody
	}
	rec := httptest.NewRecorder()
	t.Handler.ServeHTTP(rec, sreq)
	if req.Body != nil {
		req.Body.Close()
	}
	resp := rec.Result()
	resp.Request = req
	return resp, nil
}
