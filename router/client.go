// The franz-go client's settings the router owns: compression codecs, the producer's metadata age and
// the client's logger.

package router

import (
	"context"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// producerMetadataMinAge is the least time between two metadata requests of the producer. franz-go's
// default, 5 s, is what every record of a partition waits after its leader moved (a broker restart,
// a failover, a new topic that one broker does not know yet when another already serves it), and in
// exactly-once mode the whole stream waits with it. Java's producer looks again after 100 ms to 1 s;
// the requests are made only while something is wrong.
const producerMetadataMinAge = 500 * time.Millisecond

// Compression is kafka.compression as franz-go's codec (snappy for anything it does not name).
func Compression(name string) kgo.CompressionCodec {
	switch name {
	case "none":
		return kgo.NoCompression()
	case "gzip":
		return kgo.GzipCompression()
	case "lz4":
		return kgo.Lz4Compression()
	case "zstd":
		return kgo.ZstdCompression()
	default:
		return kgo.SnappyCompression()
	}
}

// kgoLogger sends franz-go's errors to slog. Its warnings repeat every second while a broker is
// down; the pipeline reports a stall once in a while instead.
type kgoLogger struct{ l *slog.Logger }

// Level implements kgo.Logger.
func (k kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelError }

// Log implements kgo.Logger.
func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lvl := slog.LevelWarn
	if level == kgo.LogLevelError {
		lvl = slog.LevelError
	}
	k.l.Log(context.Background(), lvl, "kafka client: "+msg, keyvals...)
}
