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

// Under a semaphore of limit 2 both holders may write; a Checker asks the
// store whether each token's permit is held, and refuses the holder whose
// permit is gone, even though nobody was granted after it.
func ExampleChecker_Middleware() {
	store := concurrency.NewMemoryStore()
	held := func(ctx context.Context, resource string, token uint64) (bool, error) {
		l, err := store.Holders(ctx, resource) // or POST /v1/semaphores/holders on sluice serve
		if err != nil {
			return false, err
		}
		for _, h := range l.Holders {
			if h.Fence == token {
				return true, nil
			}
		}
		return false, nil
	}
	c := &fence.Checker{Held: held}
	srv := httptest.NewServer(c.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "written")
	})))
	defer srv.Close()

	ctx := context.Background()
	sem, err := concurrency.NewDistributed(store, "reports-db", 2, concurrency.DistributedOptions{})
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
	a, err := sem.Acquire(ctx)
	if err != nil {
		panic(err)
	}
	b, err := sem.Acquire(ctx)
	if err != nil {
		panic(err)
	}
	defer b.Release(ctx)
	write(a)
	write(b)
	a.Release(ctx) // as if it had expired while its holder was paused
	write(a)       // the paused holder resumes
	// Output:
	// fence 1 -> 200 OK
	// fence 2 -> 200 OK
	// fence 1 -> 409 Conflict
}
