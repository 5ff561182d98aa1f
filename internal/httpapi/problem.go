package httpapi

import (
	"encoding/json"
	"net/http"
)

// A problem is an RFC 9457 problem details object.
type problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
}

// writeProblem answers with an application/problem+json body. The type is
// about:blank (the status says it all) and the title the status text.
func writeProblem(w http.ResponseWriter, r *http.Request, status int, detail string) {
	p := problem{
		Type:     "about:blank",
		Title:    http.StatusText(status),
		Status:   status,
		Detail:   detail,
		Instance: r.URL.Path,
	}
	h := w.Header()
	h["Content-Type"] = problemType
	h["Cache-Control"] = noStore
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(&p)
}

// writeJSON answers with v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	h := w.Header()
	h["Content-Type"] = jsonType
	h["Cache-Control"] = noStore
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
