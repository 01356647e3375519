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

	"github.com/outbox-cdc/outbox-cdc/config"
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
		k       config.Kafka
		opts    int // options beyond the seed brokers
		wantErr string
	}{
		{"plaintext", config.Kafka{Brokers: []string{"b:9092"}}, 0, ""},
		{"tls with CA and client certificate", config.Kafka{Brokers: []string{"b:9092"}, TLS: config.KafkaTLS{Enabled: true, CAFile: cert, CertFile: cert, KeyFile: key}}, 1, ""},
		{"sasl plain", config.Kafka{Brokers: []string{"b:9092"}, SASL: config.KafkaSASL{Mechanism: "PLAIN", Username: "u", Password: "p"}}, 1, ""},
		{"sasl scram-sha-512 over tls", config.Kafka{Brokers: []string{"b:9092"}, TLS: config.KafkaTLS{Enabled: true}, SASL: config.KafkaSASL{Mechanism: "scram-sha-512", Username: "u", Password: "p"}}, 2, ""},
		{"sasl scram-sha-256", config.Kafka{Brokers: []string{"b:9092"}, SASL: config.KafkaSASL{Mechanism: "SCRAM-SHA-256", Username: "u", Password: "p"}}, 1, ""},
		{"unknown mechanism", config.Kafka{Brokers: []string{"b:9092"}, SASL: config.KafkaSASL{Mechanism: "GSSAPI"}}, 0, "kafka.sasl.mechanism"},
		{"missing CA", config.Kafka{Brokers: []string{"b:9092"}, TLS: config.KafkaTLS{Enabled: true, CAFile: filepath.Join(dir, "missing.pem")}}, 0, "kafka.tls.ca_file"},
		{"CA without PEM", config.Kafka{Brokers: []string{"b:9092"}, TLS: config.KafkaTLS{Enabled: true, CAFile: notPEM}}, 0, "no PEM certificate"},
		{"bad key pair", config.Kafka{Brokers: []string{"b:9092"}, TLS: config.KafkaTLS{Enabled: true, CertFile: cert, KeyFile: notPEM}}, 0, "kafka.tls.cert_file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts, err := ClientOpts(tt.k)
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
