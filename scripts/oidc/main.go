// Command oidc writes the test OIDC provider's signing key and its JWKS for the local Kafka broker's
// OAUTHBEARER listener (scripts/services.sh): -dir holds key.pem (PKCS #8 RSA) and jwks.json, which the
// broker reads (sasl.oauthbearer.jwks.endpoint.url=file://...). Tests sign their tokens with the key.
// Nothing is written when both files exist.
package main

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
)

// KeyID is the key's id in the JWKS and the tokens' headers.
const KeyID = "outbox-cdc-test"

func main() {
	dir := flag.String("dir", "", "directory of key.pem and jwks.json")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "oidc: -dir is required")
		os.Exit(2)
	}
	if err := write(*dir); err != nil {
		fmt.Fprintln(os.Stderr, "oidc:", err)
		os.Exit(1)
	}
}

func write(dir string) error {
	keyPath, jwksPath := filepath.Join(dir, "key.pem"), filepath.Join(dir, "jwks.json")
	if _, err := os.Stat(jwksPath); err == nil {
		if _, err := os.Stat(keyPath); err == nil {
			return nil
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return err
	}
	b64 := base64.RawURLEncoding.EncodeToString
	jwks := map[string]any{"keys": []map[string]string{{
		"kty": "RSA", "use": "sig", "alg": "RS256", "kid": KeyID,
		"n": b64(key.N.Bytes()), "e": b64(big.NewInt(int64(key.E)).Bytes()),
	}}}
	data, err := json.MarshalIndent(jwks, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(jwksPath, data, 0o644)
}
