package router

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeSelfSigned writes a self-signed certificate and its key as PEM files.
func writeSelfSigned(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "outbox-cdc-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func TestClientOpts(t *testing.T) {
	dir := t.TempDir()
	cert, key := writeSelfSigned(t, dir)
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		s       Security
		opts    int // options beyond the seed brokers
		wantErr string
	}{
		{"plaintext", Security{}, 0, ""},
		{"tls with CA and client certificate", Security{TLS: true, CAFile: cert, CertFile: cert, KeyFile: key}, 1, ""},
		{"sasl plain", Security{SASLMechanism: "PLAIN", SASLUser: "u", SASLPassword: "p"}, 1, ""},
		{"sasl scram-sha-512 over tls", Security{TLS: true, SASLMechanism: "scram-sha-512", SASLUser: "u", SASLPassword: "p"}, 2, ""},
		{"sasl scram-sha-256", Security{SASLMechanism: "SCRAM-SHA-256", SASLUser: "u", SASLPassword: "p"}, 1, ""},
		{"unknown mechanism", Security{SASLMechanism: "GSSAPI"}, 0, "kafka.sasl.mechanism"},
		{"missing CA", Security{TLS: true, CAFile: filepath.Join(dir, "missing.pem")}, 0, "kafka.tls.ca_file"},
		{"CA without PEM", Security{TLS: true, CAFile: notPEM}, 0, "no PEM certificate"},
		{"bad key pair", Security{TLS: true, CertFile: cert, KeyFile: notPEM}, 0, "kafka.tls.cert_file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts, err := ClientOpts([]string{"b:9092"}, tt.s)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(opts) != 1+tt.opts {
				t.Fatalf("%d options, want %d", len(opts), 1+tt.opts)
			}
		})
	}
}
