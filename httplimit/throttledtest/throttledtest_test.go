package throttledtest

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/httplimit/rudb"
)

// TestHandlerTransport: a request reaches the handler with a body (never
// nil), the response carries the handler's answer and the request it
// answers, and a cancelled request is not served.
func TestHandlerTransport(t *testing.T) {
	db := &rudb.DB{Budget: 10, WriteCost: 10}
	var sawNilBody bool
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawNilBody = sawNilBody || r.Body == nil
		db.ServeHTTP(w, r)
	})
	c := &http.Client{Transport: HandlerTransport{Handler: h}}
	for i, want := range []int{http.StatusCreated, http.StatusTooManyRequests} {
		req, err := http.NewRequest(http.MethodPost, "http://db.test/items", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || resp.Request != req {
			t.Fatalf("write %d: %d (request %p), want %d (%p)", i, resp.StatusCode, resp.Request, want, req)
		}
	}
	resp, err := c.Get("http://db.test/items")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if sawNilBody {
		t.Error("the handler saw a nil body")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://db.test/items", nil)
	if _, err := c.Do(req); err == nil {
		t.Error("a cancelled request was served")
	}
	if st := db.Stats(); st.Requests != 3 {
		t.Errorf("the database saw %d requests, want 3", st.Requests)
	}
}
