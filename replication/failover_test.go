package replication

import (
	"slices"
	"testing"
)

func TestSplitSlotList(t *testing.T) {
	for in, want := range map[string][]string{
		"":            nil,
		"sb1":         {"sb1"},
		" sb1 , sb2 ": {"sb1", "sb2"},
		`"Sb 1",sb2`:  {"Sb 1", "sb2"},
		`"a""b"`:      {`a"b`},
		"sb1,,sb2,":   {"sb1", "sb2"},
	} {
		if got := splitSlotList(in); !slices.Equal(got, want) {
			t.Errorf("splitSlotList(%q) = %q, want %q", in, got, want)
		}
	}
}
