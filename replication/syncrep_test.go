package replication

import "testing"

// TestSynchronousStandby: which synchronous_standby_names name a walsender of application_name
// outbox-cdc, in every form the server accepts.
func TestSynchronousStandby(t *testing.T) {
	tests := []struct {
		setting string
		want    bool
	}{
		{"", false},
		{"*", true},
		{"standby1", false},
		{"standby1, *", true},
		{`s1, "x(outbox-cdc)"`, false},
		{`FIRST 1 ("x(y)", "outbox-cdc")`, true},
		{`"outbox-cdc"`, true},
		{`"OUTBOX-CDC"`, true}, // compared without regard to case
		{"FIRST 1 (standby1, standby2)", false},
		{"FIRST 1 (standby1, *)", true},
		{"ANY 2 (s1, s2, \"outbox-cdc\")", true},
		{"2 (s1, s2)", false},
		{"any 1 (*)", true},
		{`"*"`, true},
		{`"a,b", "c""d"`, false},
		{`"outbox-cdc-2"`, false},
	}
	for _, tt := range tests {
		if got := synchronousStandby(tt.setting, "outbox-cdc"); got != tt.want {
			t.Errorf("synchronousStandby(%q) = %t, want %t", tt.setting, got, tt.want)
		}
	}
	if got := splitNames(`"a,b", "c""d" , e`); len(got) != 3 || got[0] != "a,b" || got[1] != `c"d` || got[2] != "e" {
		t.Errorf("splitNames = %q", got)
	}
}
