package testenv

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"os"
	"testing"
	"time"
)

// OAuth test provider: the local broker's OAUTHBEARER listener (scripts/services.sh) validates tokens
// against the JWKS of a key scripts/oidc wrote under .dev/kafka/oidc; tests sign their own tokens
// with it, for the audience and issuer the broker expects.
const (
	// OAuthAudience and OAuthIssuer are the claims the broker expects.
	OAuthAudience = "outbox-cdc-test"
	OAuthIssuer   = "outbox-cdc-test-idp"
	// OAuthSubject is the principal the broker makes of the tests' tokens (a super user there).
	OAuthSubject = "outbox-oidc"
)

// OAuthBrokers returns the local broker's OAUTHBEARER listener, or fails with how to start it.
func OAuthBrokers(t testing.TB) []string {
	t.Helper()
	return listener(t, "OUTBOX_CDC_TEST_OAUTH_BROKERS")
}

// OAuthToken signs a token for subject that expires after lifetime, with the test provider's key.
func OAuthToken(t testing.TB, subject string, lifetime time.Duration) string {
	t.Helper()
	path := lookup(t, "OUTBOX_CDC_TEST_OAUTH_KEY")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the test OIDC key (OUTBOX_CDC_TEST_OAUTH_KEY): %v: %s", err, startHint)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("the test OIDC key %s holds no PEM", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, ok := k.(*rsa.PrivateKey)
	if !ok {
		t.Fatalf("the test OIDC key %s is not RSA", path)
	}
	now := time.Now()
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	signing := enc(map[string]string{"alg": "RS256", "typ": "JWT", "kid": "outbox-cdc-test"}) + "." +
		enc(map[string]any{"sub": subject, "aud": OAuthAudience, "iss": OAuthIssuer, "iat": now.Unix(), "nbf": now.Add(-time.Minute).Unix(),
			"exp": now.Add(lifetime).Unix(), "scope": "kafka"})
	sum := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig)
}
