package testenv

import (
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/internal/faultnet"
)

// NewProxy starts a TCP proxy to target (host:port) for network faults; it stops when the test ends.
func NewProxy(t testing.TB, target string) *faultnet.Proxy {
	t.Helper()
	p, err := faultnet.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// ProxyURL returns rawURL with its host:port replaced by the proxy's.
func ProxyURL(t testing.TB, p *faultnet.Proxy, rawURL string) string {
	t.Helper()
	u, err := p.URL(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// DeadHostFirst returns rawURL as a multi-host URL whose first host does not answer (127.0.0.1:1),
// and the host:port of rawURL, which does.
func DeadHostFirst(rawURL string) (multi, alive string) {
	at := strings.Index(rawURL, "@") + 1
	slash := strings.Index(rawURL[at:], "/") + at
	alive = rawURL[at:slash]
	return rawURL[:at] + "127.0.0.1:1," + alive + rawURL[slash:], alive
}
