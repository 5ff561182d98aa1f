package httplimit

import (
	"encoding/json"
	"testing"
)

// TestAppendJSON checks the problem bodies' string encoding byte for byte
// (escapes, HTML-sensitive bytes, DEL, invalid UTF-8 between safe runs)
// and that every output decodes to what encoding/json's encoding of the
// input decodes to (each invalid byte one U+FFFD).
func TestAppendJSON(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"", `""`},
		{"plain text", `"plain text"`},
		{`q"u\o`, `"q\"u\\o"`},
		{"tab\tnl\n", `"tab\u0009nl\u000a"`},
		{"<a&b>", `"\u003ca\u0026b\u003e"`},
		{"del\x7f", `"del\u007f"`},
		{"é\u2028x€", "\"é\u2028x€\""},
		{"bad\xffutf8\xe2\x82", `"bad\ufffdutf8\ufffd\ufffd"`},
		{"\x00", `"\u0000"`},
		{"run of safe bytes, then \" and more", `"run of safe bytes, then \" and more"`},
	} {
		got := appendJSON([]byte("prefix:"), tt.in)
		if string(got) != "prefix:"+tt.want {
			t.Errorf("appendJSON(%q) = %s, want %s", tt.in, got[len("prefix:"):], tt.want)
		}
		got = appendJSON(nil, []byte(tt.in))
		if string(got) != tt.want {
			t.Errorf("appendJSON([]byte(%q)) = %s, want %s", tt.in, got, tt.want)
		}
		var back, want string
		enc, _ := json.Marshal(tt.in)
		if err := json.Unmarshal(enc, &want); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(got, &back); err != nil {
			t.Errorf("%s does not decode: %v", got, err)
		} else if back != want {
			t.Errorf("%s decodes to %q, want %q", got, back, want)
		}
	}
}

// BenchmarkAppendJSON encodes a 429's detail sentence, the longest string
// of a problem body.
func BenchmarkAppendJSON(b *testing.B) {
	s := `Quota "per_ip" for ip 192.0.2.1 allows 100 units per 60 s; this request costs 1 and 0 remain. Retry in 37 s.`
	buf := make([]byte, 0, 256)
	b.SetBytes(int64(len(s)))
	for b.Loop() {
		buf = appendJSON(buf[:0], s)
	}
}
