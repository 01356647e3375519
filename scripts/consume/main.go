// Command consume prints the records of a Kafka topic from the beginning: a small viewer for
// `make run`, so that a new user needs no Kafka tools to watch events arrive.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	brokers := flag.String("brokers", os.Getenv("OUTBOX_CDC_BROKERS"), "Kafka brokers, comma-separated ($OUTBOX_CDC_BROKERS)")
	topic := flag.String("topic", "", "topic to read (required)")
	isolation := flag.String("isolation", "read_committed", "read_committed (what exactly-once consumers must use: records of aborted Kafka transactions are never shown) or read_uncommitted")
	flag.Parse()
	level := kgo.ReadCommitted()
	switch *isolation {
	case "read_committed":
	case "read_uncommitted":
		level = kgo.ReadUncommitted()
	default:
		fmt.Fprintln(os.Stderr, "consume: -isolation must be read_committed or read_uncommitted")
		os.Exit(2)
	}
	if *topic == "" || *brokers == "" {
		fmt.Fprintln(os.Stderr, "usage: consume -topic NAME [-brokers host:port] (source .dev/env for the local broker)")
		os.Exit(2)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(*brokers, ",")...), kgo.ConsumeTopics(*topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(level))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer cl.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	fmt.Fprintf(os.Stderr, "reading %s from the beginning; Ctrl-C to stop\n", *topic)
	for ctx.Err() == nil {
		fetches := cl.PollFetches(ctx)
		fetches.EachRecord(func(r *kgo.Record) {
			var hs []string
			for _, h := range r.Headers {
				hs = append(hs, h.Key+"="+string(h.Value))
			}
			fmt.Printf("%s/%d@%d key=%s headers[%s]\n  %s\n", r.Topic, r.Partition, r.Offset, r.Key, strings.Join(hs, " "), r.Value)
		})
	}
}
