package pipeline

import (
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/faultnet"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestLostAcknowledgementsAreNotResent: at-least-once, Kafka writes records but its answers are lost
// (a broker that stops answering, a network that drops the replies) for longer than
// kafka.ack_timeout. The session lets go of PostgreSQL, but its records stay with the Kafka producer,
// which sends them again with the same producer id and sequence numbers once a connection answers, so
// the broker drops those it had written; the next session waits for them and skips what they
// delivered. Closing the producer at once had failed them, and the replay sent every record the
// broker had written meanwhile a second time.
func TestLostAcknowledgementsAreNotResent(t *testing.T) {
	listener, advertised := testenv.RemoteListener(t)
	proxy, err := faultnet.StartDelayed(advertised, listener, 0)
	if err != nil {
		t.Fatalf("a proxy on the broker's advertised remote address %s: %v", advertised, err)
	}
	defer proxy.Close()
	f := testenv.NewFixture(t)
	cfg := testConfig(f)
	cfg.Kafka.Delivery = config.DeliveryAtLeastOnce
	cfg.Kafka.Brokers = []string{advertised}
	cfg.Kafka.AckTimeout = 3 * time.Second
	run := startPipeline(t, cfg)
	writer := testenv.StartWriter(t, f, testenv.NewGenerator(10, "Muted"), 3, 5*time.Millisecond, true)
	testenv.WaitFor(t, time.Minute, "records delivered through the proxy", func() bool { return run.p.Health().Produced > 100 })
	produced := run.p.Health().Produced
	if n := proxy.MuteReplies(); n == 0 {
		t.Fatal("no connection to Kafka passed the proxy")
	}
	testenv.WaitFor(t, 3*time.Minute, "the session released after kafka.ack_timeout, then delivering again", func() bool {
		h := run.p.Health()
		return h.Restarts > 0 && run.p.State() == StateStreaming && h.Produced > produced+300
	})
	time.Sleep(2 * time.Second)
	want, err := writer.Stop()
	if err != nil {
		t.Fatal(err)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Muted"), len(want), 2*time.Minute)
	dups := testenv.VerifyDelivery(t, f, want, got)
	h := run.p.Health()
	t.Logf("%d events, Kafka's answers lost for a while: %d sessions rebuilt, %d rows skipped as acknowledged, %d duplicates", len(want), h.Restarts, h.SkippedRows, dups)
	if dups != 0 {
		t.Errorf("%d events sent twice: the records Kafka had written while its answers were lost were sent again", dups)
	}
}
