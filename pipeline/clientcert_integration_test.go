package pipeline

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// testCA is a private certificate authority of a test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "outbox-cdc test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a certificate for cn (and, for a server, 127.0.0.1) and its key, as PEM.
func (ca *testCA) issue(t *testing.T, cn string, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// TestClientCertificateAuthentication: a server that takes the router's role only with a client
// certificate of a private CA (pg_hba cert, hostssl), and the router with sslmode=verify-full,
// sslrootcert, sslcert and sslkey in postgres.url: it sets up, streams, and every event arrives; the
// same URL without the certificate is refused.
func TestClientCertificateAuthentication(t *testing.T) {
	cluster := testenv.NewCluster(t, "wal_level = logical")
	ca := newTestCA(t)
	srvCert, srvKey := ca.issue(t, "127.0.0.1", true)
	cluster.WriteFile(t, "server.crt", srvCert, 0o644)
	cluster.WriteFile(t, "server.key", srvKey, 0o600)
	cluster.WriteFile(t, "ca.crt", ca.pem, 0o644)
	cluster.WriteFile(t, "pg_hba.conf", []byte("local all all trust\nhost all postgres 127.0.0.1/32 trust\nhostssl all all 127.0.0.1/32 cert\nhostssl replication all 127.0.0.1/32 cert\n"), 0o600)
	cluster.Configure(t, "ssl = on", "ssl_cert_file = 'server.crt'", "ssl_key_file = 'server.key'", "ssl_ca_file = 'ca.crt'")
	cluster.Restart(t, "fast", time.Minute)

	ctx := context.Background()
	admin, err := pgx.Connect(ctx, cluster.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	script, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "sql", "outbox.sql"))
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{"CREATE ROLE certrouter LOGIN REPLICATION", "CREATE SCHEMA cert AUTHORIZATION certrouter", "GRANT CREATE ON DATABASE postgres TO certrouter", "SET ROLE certrouter"} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if _, err := admin.Exec(ctx, strings.ReplaceAll(string(script), "public.outbox", "cert.outbox")); err != nil {
		t.Fatalf("sql/outbox.sql: %v", err)
	}
	dir := t.TempDir()
	cliCert, cliKey := ca.issue(t, "certrouter", false)
	for name, data := range map[string][]byte{"ca.pem": ca.pem, "client.pem": cliCert, "client.key": cliKey} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f := testenv.NewFixture(t) // for Kafka's brokers and topic names
	cfg := testConfig(f)
	q := url.Values{"sslmode": {"verify-full"}, "sslrootcert": {filepath.Join(dir, "ca.pem")}, "sslcert": {filepath.Join(dir, "client.pem")}, "sslkey": {filepath.Join(dir, "client.key")}}
	cfg.Postgres.URL = fmt.Sprintf("postgres://certrouter@127.0.0.1:%d/postgres?%s", cluster.Port, q.Encode())
	cfg.Postgres.Table, cfg.Postgres.Slot, cfg.Postgres.Publication = "cert.outbox", "cert_slot", "cert_pub"
	run := startPipeline(t, cfg)
	gen := testenv.NewGenerator(2, "Certified")
	evs := []testenv.Event{gen.Event(0), gen.Event(1), gen.Event(0)}
	if err := testenv.InsertTx(ctx, admin, "cert.outbox", evs, false); err != nil {
		t.Fatal(err)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Certified"), len(evs), time.Minute, testenv.ConsumerOpts()...)
	testenv.VerifyDelivery(t, f, evs, got)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	// Without the client certificate the server refuses the role.
	q.Del("sslcert")
	q.Del("sslkey")
	bare := cfg
	bare.Postgres.URL = fmt.Sprintf("postgres://certrouter@127.0.0.1:%d/postgres?%s", cluster.Port, q.Encode())
	p, err := New(bare, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := p.Run(rctx); err == nil {
		t.Fatal("the server took the role without its client certificate: the test proves nothing")
	}
}
