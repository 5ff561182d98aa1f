package fence_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/sluicehq/sluice/concurrency"
	"github.com/sluicehq/sluice/fence"
)

// A protected service checks the fencing token of each write; a holder
// whose permit was taken over by another is refused, even though it goes
// on sending as if it still held it.
func ExampleGuard_Middleware() {
	var g fence.Guard
	srv := httptest.NewServer(g.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "written")
	})))
	defer srv.Close()

	ctx := context.Background()
	sem, err := concurrency.NewDistributed(concurrency.NewMemoryStore(), "orders-db", 1, concurrency.DistributedOptions{})
	if err != nil {
		panic(err)
	}
	write := func(p *concurrency.Permit) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
		if err != nil {
			panic(err)
		}
		fence.Set(req.Header, sem.Name(), p.Fence())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Println("fence", p.Fence(), "->", resp.Status)
	}

	old, err := sem.Acquire(ctx)
	if err != nil {
		panic(err)
	}
	write(old)
	old.Release(ctx) // as if it had expired while its holder was paused
	cur, err := sem.Acquire(ctx)
	if err != nil {
		panic(err)
	}
	defer cur.Release(ctx)
	write(cur)
	write(old) // the paused holder resumes
	// Output:
	// fence 1 -> 200 OK
	// fence 2 -> 200 OK
	// fence 1 -> 409 Conflict
}
