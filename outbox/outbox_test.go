package outbox

import (
	"strings"
	"testing"
)

func TestValidTopic(t *testing.T) {
	for name, want := range map[string]bool{
		"orders": true, "a.b_c-1": true, "": false, ".": false, "..": false, "bad name": false, "bad/name": false,
		"__consumer_offsets": false, "__transaction_state": false, "_single": true,
		strings.Repeat("x", 249): true, strings.Repeat("x", 250): false, "ü": false,
	} {
		if got := ValidTopic(name); got != want {
			t.Errorf("ValidTopic(%q) = %t, want %t", name, got, want)
		}
	}
}
