package router

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// Security configures how the Kafka clients connect: TLS and SASL.
type Security struct {
	// TLS turns TLS on. CAFile (PEM) replaces the system roots; CertFile and KeyFile (PEM) are the
	// client certificate for mutual TLS. InsecureSkipVerify turns verification off (tests only).
	TLS                       bool
	CAFile, CertFile, KeyFile string
	// InsecureSkipVerify turns certificate verification off (tests only).
	InsecureSkipVerify bool
	// SASLMechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty turns SASL off.
	SASLMechanism string
	// SASLUser and SASLPassword are the SASL credentials.
	SASLUser, SASLPassword string
}

// ClientOpts returns the franz-go options that connect to brokers with s.
func ClientOpts(brokers []string, s Security) ([]kgo.Opt, error) {
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...)}
	if s.TLS {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: s.InsecureSkipVerify} //nolint:gosec // opt-in, documented as tests only
		if s.CAFile != "" {
			pem, err := os.ReadFile(s.CAFile)
			if err != nil {
				return nil, fmt.Errorf("kafka.tls.ca_file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("kafka.tls.ca_file: no PEM certificate in %s", s.CAFile)
			}
			cfg.RootCAs = pool
		}
		if s.CertFile != "" || s.KeyFile != "" {
			cert, err := tls.LoadX509KeyPair(s.CertFile, s.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("kafka.tls.cert_file / key_file: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, kgo.Dialer((&tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: cfg}).DialContext))
	}
	switch strings.ToUpper(s.SASLMechanism) {
	case "":
	case "PLAIN":
		opts = append(opts, kgo.SASL(plain.Auth{User: s.SASLUser, Pass: s.SASLPassword}.AsMechanism()))
	case "SCRAM-SHA-256":
		opts = append(opts, kgo.SASL(scram.Auth{User: s.SASLUser, Pass: s.SASLPassword}.AsSha256Mechanism()))
	case "SCRAM-SHA-512":
		opts = append(opts, kgo.SASL(scram.Auth{User: s.SASLUser, Pass: s.SASLPassword}.AsSha512Mechanism()))
	default:
		return nil, errors.New("kafka.sasl.mechanism: must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
	}
	return opts, nil
}
