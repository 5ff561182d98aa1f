package storekey_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/storekey"
)

func TestBound(t *testing.T) {
	long := "name|" + strings.Repeat("v", storekey.MaxLen) // MaxLen+5 bytes
	sum := sha256.Sum256([]byte(long))
	tests := []struct {
		name, key, want string
	}{
		{"short", "name|v", "name|v"},
		{"at the bound", "name|" + strings.Repeat("v", storekey.MaxLen-5), "name|" + strings.Repeat("v", storekey.MaxLen-5)},
		{"over the bound", long, "name|#" + hex.EncodeToString(sum[:])},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(storekey.Bound([]byte(tt.key), len("name"))); got != tt.want {
				t.Errorf("Bound(%d bytes) = %q, want %q", len(tt.key), got, tt.want)
			}
		})
	}
	a := storekey.Bound([]byte(long), len("name"))
	b := storekey.Bound([]byte(long[:len(long)-1]+"w"), len("name"))
	if string(a) == string(b) {
		t.Error("two long keys that differ in their last byte collided")
	}
}
