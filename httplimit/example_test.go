package httplimit_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/httplimit/rudb"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
)

// Per tenant 1000 units a minute and per client IP 10 requests a minute,
// decided together; writes cost 10, reads 1.
func ExampleMiddleware() {
	store := memstore.New(memstore.Options{})
	defer store.Close()
	limits, err := httplimit.New(httplimit.Options{Store: store, Policies: []httplimit.Policy{
		{Rule: ratelimit.Rule{Name: "tenant", Quota: 1000, Period: time.Minute},
			Keys: []httplimit.Key{httplimit.ByHeader("X-Tenant")},
			Cost: httplimit.CostByMethod(map[string]int64{"POST": 10, "PUT": 10}, 1)},
		{Rule: ratelimit.Rule{Name: "ip", Quota: 10, Period: time.Minute},
			Keys: []httplimit.Key{httplimit.ByIP()}},
	}})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /items/{id}", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "item\n") })
	h := limits.Handler(mux) // http.ListenAndServe(":8080", h)

	for i := range 12 {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/items/1", nil)
		req.Header.Set("X-Tenant", "acme")
		h.ServeHTTP(rec, req)
		if i == 0 || i >= 10 {
			fmt.Println(rec.Code, rec.Header().Get("RateLimit"))
		}
	}
	// Output:
	// 200 "tenant";r=999;t=1, "ip";r=9;t=6
	// 429 "tenant";r=990;t=1, "ip";r=0;t=60
	// 429 "tenant";r=990;t=1, "ip";r=0;t=60
}

// A job writes records to a database that grants 2,000 RU a second; each
// write costs 10 RU. The Client paces the writes to the budget, so almost
// none is refused.
func ExampleClient() {
	db := &rudb.DB{Budget: 2000, WriteCost: 10}
	srv := httptest.NewServer(db)
	defer srv.Close()

	c := &httplimit.Client{
		HTTP:    srv.Client(),
		Limiter: ratelimit.NewLimiter(2000, 10), // RU per second, burst of one write
	}
	ctx := httplimit.WithCost(context.Background(), 10)
	for i := range 50 {
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/items", strings.NewReader(fmt.Sprint(i)))
		resp, err := c.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
	}
	fmt.Println("written:", db.Stats().Written)
	// Output: written: 50
}
