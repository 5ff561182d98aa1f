package rediskey_test

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/rediskey"
)

// TestAppend pins the encoding: it is part of the keys in deployed Redis
// servers, so every output here is a fixed literal, not recomputed.
func TestAppend(t *testing.T) {
	x128 := strings.Repeat("x", rediskey.MaxRaw)
	tests := []struct{ name, in, want string }{
		{"empty", "", ""},
		{"open brace", "{", "ew"},
		{"close brace", "}", "fQ"},
		{"empty tag", "{}", "e30"},
		{"newline", "\n", "Cg"},
		{"braces inside", "a}{b", "YX17Yg"},
		{"plain", "api", "YXBp"},
		{"invalid UTF-8", "\xff\xfe", "__4"},
		{"tilde", "~", "fg"},
		{"exactly MaxRaw bytes", x128, strings.Repeat("eHh4", 42) + "eHg"},
		{"MaxRaw+1 bytes", x128 + "x", "~DsnrM-dFELzdHy6lUgboLyFknFwr7L8rQz60dbNMAb0"},
		{"MaxRaw+1 bytes, last differs", x128 + "y", "~CwOJGktzBXu2ongjQ8Kk4ud18TQ1CfsrNGcYtuXykzo"},
		{"one megabyte", strings.Repeat("\n{}", 1<<18), "~i1fIpxP9FBHli0Obvs1uhqp1Q6WdLkhjNbUvdzOVneY"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(rediskey.Append(nil, tt.in)); got != tt.want {
				t.Errorf("Append(%d bytes) = %q, want %q", len(tt.in), got, tt.want)
			}
			if got := string(rediskey.Append([]byte("p:{"), tt.in)); got != "p:{"+tt.want {
				t.Errorf("Append(\"p:{\", %d bytes) = %q, want %q", len(tt.in), got, "p:{"+tt.want)
			}
			if got := rediskey.Len(len(tt.in)); got != len(tt.want) {
				t.Errorf("Len(%d) = %d, want %d", len(tt.in), got, len(tt.want))
			}
		})
	}
}
