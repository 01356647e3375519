package pipeline

import (
	"testing"
	"time"
)

// TestQuietClock: a transaction that follows a quiet period goes out at its end; one that follows
// another closely waits for the stream to stay quiet; the time a blocking Flush took is not a quiet
// period.
func TestQuietClock(t *testing.T) {
	const quiet = 50 * time.Millisecond
	q := quietClock{quiet: quiet}
	q.lastEnd = time.Now().Add(-time.Second) // the stream has been quiet for a second
	q.row()
	q.end()
	if due := q.due(); !due.Equal(q.lastEnd) {
		t.Fatalf("isolated transaction: due %s after its end, want at once", due.Sub(q.lastEnd))
	}
	q.row() // the next one follows at once: load
	q.end()
	if due := q.due(); !due.Equal(q.lastEnd.Add(quiet)) {
		t.Fatalf("back-to-back transaction: due %s after its end, want the quiet period %s", due.Sub(q.lastEnd), quiet)
	}
	q.end() // a transaction without rows (another table) keeps the stream busy
	if q.isolated {
		t.Fatal("a transaction without rows counted as isolated")
	}
	// A Kafka commit blocked the stream longer than the quiet period; rows waiting behind it are load.
	q.lastEnd = time.Now().Add(-time.Second)
	q.sent()
	q.row()
	q.end()
	if q.isolated {
		t.Fatal("the transaction right after a blocking flush counted as isolated")
	}
}
