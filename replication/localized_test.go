package replication

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestErrorsAreClassifiedInAnyLanguage: the server writes its messages in the language of lc_messages;
// the errors that stop the router for good (a publication missing at the slot's position) or name a
// set-up fix (rows the role may not read) are told by SQLSTATE and context, which are never translated.
func TestErrorsAreClassifiedInAnyLanguage(t *testing.T) {
	where := func(lang string) string {
		switch lang {
		case "de":
			return `Slot »s«, Ausgabe-Plugin "pgoutput", im change-Callback, zugehörige LSN 0/1A0D73F0`
		default:
			return `slot "s", output plugin "pgoutput", in the change callback, associated LSN 0/1A0D73F0`
		}
	}
	cases := []struct {
		name string
		err  *pgconn.PgError
		want bool
	}{
		{"english", &pgconn.PgError{Code: "42704", Message: `publication "outbox_cdc" does not exist`, Where: where("en")}, true},
		{"german", &pgconn.PgError{Code: "42704", Message: `Publikation »outbox_cdc« existiert nicht`, Where: where("de")}, true},
		{"english without context", &pgconn.PgError{Code: "42704", Message: `publication "outbox_cdc" does not exist`}, true},
		{"a missing slot", &pgconn.PgError{Code: "42704", Message: `Replikations-Slot »outbox_cdc« existiert nicht`}, false},
		{"another error while decoding", &pgconn.PgError{Code: "XX000", Message: "could not open relation", Where: where("en")}, false},
	}
	for _, c := range cases {
		if got := missingPublication(c.err); got != c.want {
			t.Errorf("%s: missingPublication = %t, want %t", c.name, got, c.want)
		}
		if got := errors.Is(serverError(c.err, Options{}), ErrOutboxChanged); got != c.want {
			t.Errorf("%s: serverError wraps ErrOutboxChanged: %t, want %t", c.name, got, c.want)
		}
	}

	o := Outbox{Schema: "public", Table: "outbox"}
	for _, msg := range []string{
		`query would be affected by row-level security policy for table "outbox"`,
		`Anfrage würde von Policy für Sicherheit auf Zeilenebene für Tabelle »outbox« beeinflusst werden`,
		`permission denied for table outbox`,
	} {
		err := hiddenRows(fmt.Errorf("count snapshot rows: %w", &pgconn.PgError{Code: "42501", Message: msg}), o)
		if !errors.Is(err, ErrNotSetUp) {
			t.Errorf("%q: %v, want a set-up error naming the fix", msg, err)
		}
	}
	if err := hiddenRows(&pgconn.PgError{Code: "57014", Message: "canceling statement"}, o); errors.Is(err, ErrNotSetUp) {
		t.Errorf("a canceled statement counted as a set-up error: %v", err)
	}
}
