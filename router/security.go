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

	"github.com/outbox-cdc/outbox-cdc/config"
)

// ClientOpts returns the franz-go options that connect to k's brokers with its TLS and SASL
// settings.
func ClientOpts(k config.Kafka) ([]kgo.Opt, error) {
	opts := []kgo.Opt{kgo.SeedBrokers(k.Brokers...)}
	if k.TLS.Enabled {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: k.TLS.InsecureSkipVerify} //nolint:gosec // opt-in, documented as never in production
		if k.TLS.CAFile != "" {
			pem, err := os.ReadFile(k.TLS.CAFile)
			if err != nil {
				return nil, fmt.Errorf("kafka.tls.ca_file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("kafka.tls.ca_file: no PEM certificate in %s", k.TLS.CAFile)
			}
			cfg.RootCAs = pool
		}
		if k.TLS.CertFile != "" || k.TLS.KeyFile != "" {
			cert, err := tls.LoadX509KeyPair(k.TLS.CertFile, k.TLS.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("kafka.tls.cert_file / key_file: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, kgo.Dialer((&tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: cfg}).DialContext))
	}
	user, pass := k.SASL.Username, k.SASL.Password
	switch strings.ToUpper(k.SASL.Mechanism) {
	case "":
	case "PLAIN":
		opts = append(opts, kgo.SASL(plain.Auth{User: user, Pass: pass}.AsMechanism()))
	case "SCRAM-SHA-256":
		opts = append(opts, kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()))
	case "SCRAM-SHA-512":
		opts = append(opts, kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()))
	case config.SASLOAuthBearer:
		opts = append(opts, kgo.SASL(NewTokenSource(k.SASL.OAuth).Mechanism()))
	case config.SASLAWSMSKIAM:
		opts = append(opts, kgo.SASL(mskIAM(k.SASL.AWS)))
	default:
		return nil, errors.New("kafka.sasl.mechanism: must be PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or AWS_MSK_IAM")
	}
	return opts, nil
}
