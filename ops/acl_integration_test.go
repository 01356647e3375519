package ops

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/outbox"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
)

// grant gives principal the ACLs acls on the broker adm talks to (as a super user).
func grant(t *testing.T, adm *kadm.Client, principal string, acls []ACL) {
	t.Helper()
	ops := map[string]kadm.ACLOperation{"Write": kadm.OpWrite, "Describe": kadm.OpDescribe, "DescribeConfigs": kadm.OpDescribeConfigs,
		"Read": kadm.OpRead, "Create": kadm.OpCreate}
	for _, a := range acls {
		b := kadm.NewACLs().Allow(principal).ResourcePatternType(kadm.ACLPatternLiteral)
		if a.Prefixed {
			b.ResourcePatternType(kadm.ACLPatternPrefixed)
		}
		var want []kadm.ACLOperation
		for _, o := range a.Operations {
			want = append(want, ops[o])
		}
		b.Operations(want...)
		switch a.Resource {
		case "topic":
			b.Topics(a.Name)
		case "transactional-id":
			b.TransactionalIDs(a.Name)
		case "group":
			b.Groups(a.Name)
		default:
			t.Fatalf("an ACL of a resource the test does not know: %+v", a)
		}
		res, err := adm.CreateACLs(context.Background(), b)
		if err == nil {
			for _, r := range res {
				if r.Err != nil {
					err = r.Err
				}
			}
		}
		if err != nil {
			t.Fatalf("create ACL %+v: %v", a, err)
		}
	}
}

// TestLeastPrivilegePrincipal: a Kafka principal that may describe and write existing topics but not
// create any — exactly the ACLs `init` prints for kafka.create_topics off — runs the router with
// kafka.create_topics on (the default): the existing topic takes its rows, and the rows of a topic
// that does not exist are dead-lettered with the reason instead of the router retrying for ever. In
// both delivery modes (exactly-once: the transactional ids and the checkpoint topic created
// beforehand). Against the local broker's StandardAuthorizer.
func TestLeastPrivilegePrincipal(t *testing.T) {
	for _, mode := range []string{config.DeliveryAtLeastOnce, config.DeliveryExactlyOnce} {
		t.Run(mode, func(t *testing.T) { testLeastPrivilegePrincipal(t, mode) })
	}
}

func testLeastPrivilegePrincipal(t *testing.T, mode string) {
	f := testenv.NewFixture(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	user := "lp-" + strings.ReplaceAll(f.Slot, "_", "-")
	if _, err := adm.AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{User: user, Mechanism: kadm.ScramSha256, Iterations: 4096, Password: "lp-secret"}}); err != nil {
		t.Fatal(err)
	}
	cfg := testenv.RouterConfig(f)
	cfg.Kafka.Delivery = mode
	cfg.Kafka.Brokers = testenv.SASLBrokers(t)
	cfg.Kafka.SASL = config.KafkaSASL{Mechanism: "SCRAM-SHA-256", Username: user, Password: "lp-secret"}
	cfg.Routing.DLQTopic = f.TopicPrefix + ".dlq"
	// The ACLs init prints for a principal that may not create topics, and the topics it must then
	// find: the one rows go to, the dead-letter topic, the checkpoint topic.
	noCreate := cfg
	noCreate.Kafka.CreateTopics = false
	grant(t, adm, "User:"+user, KafkaACLs(noCreate))
	existing := f.TopicPrefix + ".Exists"
	if _, err := adm.CreateTopics(ctx, 3, -1, nil, existing, cfg.Routing.DLQTopic); err != nil {
		t.Fatal(err)
	}
	if mode == config.DeliveryExactlyOnce {
		if _, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("compact")}, cfg.Kafka.CheckpointTopic); err != nil {
			t.Fatal(err)
		}
	}
	p, err := pipeline.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	testenv.WaitFor(t, time.Minute, "streaming as the least-privilege principal", func() bool { return p.State() == pipeline.StateStreaming })
	gen := testenv.NewGenerator(3, "Exists")
	exists := []testenv.Event{gen.Event(0), gen.Event(1), gen.Event(0)}
	missing := testenv.NewGenerator(1, "Missing").WithPrefix("m-").Event(0)
	if err := testenv.InsertTx(ctx, f.DB, f.Table, append([]testenv.Event{exists[0], missing}, exists[1:]...), false); err != nil {
		t.Fatal(err)
	}
	var consumer []kgo.Opt
	if mode == config.DeliveryExactlyOnce {
		consumer = append(consumer, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, []string{existing}, len(exists), time.Minute, consumer...)
	testenv.VerifyDelivery(t, f, exists, got)
	dlq := testenv.Consume(t, f.Brokers, []string{cfg.Routing.DLQTopic}, 1, time.Minute, consumer...)
	if len(dlq) != 1 || testenv.EventID(dlq[0]) != missing.ID {
		t.Fatalf("dead-letter topic holds %d records, want the row for the missing topic", len(dlq))
	}
	if reason := testenv.Header(dlq[0], outbox.HeaderDLQReason); !strings.Contains(reason, "CREATE") || !strings.Contains(reason, f.TopicPrefix+".Missing") {
		t.Errorf("dead-letter reason %q does not say the topic may not be created", reason)
	}
	if _, err := adm.DeleteACLs(ctx, kadm.NewACLs().Allow("User:"+user).AllowHosts().AnyResource().ResourcePatternType(kadm.ACLPatternAny).Operations(kadm.OpAny)); err != nil {
		t.Logf("delete the test's ACLs: %v", err)
	}
	t.Logf("%s: %d rows delivered to the existing topic, 1 dead-lettered, as %s without CREATE", mode, len(exists), fmt.Sprint("User:", user))
}
