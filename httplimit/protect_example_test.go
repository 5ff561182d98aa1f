package httplimit_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/httplimit"
)

// A handler protected from overload: at most one request in flight (a
// real server would allow hundreds, and let the limit adapt below them).
// While one is being served, the next is shed at once with 503, a
// Retry-After computed from the Guard's state and a problem body saying
// the server is overloaded.
func ExampleProtect() {
	g, err := adaptive.NewGuard(adaptive.GuardOptions{Concurrency: adaptive.ConcurrencyOptions{Max: 1, Initial: 1}})
	if err != nil {
		log.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
	})
	h := httplimit.Protect(g, httplimit.ProtectOptions{})(slow)

	first := make(chan int)
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		first <- rec.Code
	}()
	<-entered
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	fmt.Println(rec.Code, rec.Header().Get("Content-Type"), rec.Header().Get("Retry-After") != "")
	close(release)
	fmt.Println(<-first)
	// Output:
	// 503 application/problem+json true
	// 200
}
