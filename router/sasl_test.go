package router

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/config"
)

// tokenEndpoint is a test OIDC token endpoint: it checks the client's credentials, counts the
// tokens it gives and has them live for lifetime.
func tokenEndpoint(t *testing.T, secret string, lifetime int, post bool) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var issued atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil || r.Form.Get("grant_type") != "client_credentials" || r.Form.Get("scope") != "kafka" {
			http.Error(w, `{"error":"invalid_request"}`, http.StatusBadRequest)
			return
		}
		id, pw, basic := r.BasicAuth()
		if post {
			id, pw, basic = r.PostForm.Get("client_id"), r.PostForm.Get("client_secret"), true
		}
		if !basic || id != "outbox-cdc" || pw != secret {
			w.WriteHeader(http.StatusUnauthorized)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "invalid_client", "error_description": "bad credentials"})
			return
		}
		n := issued.Add(1)
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": "token-" + string(rune('0'+n)), "token_type": "Bearer", "expires_in": lifetime})
	}))
	t.Cleanup(srv.Close)
	return srv, &issued
}

// TestTokenSourceRefreshesBeforeExpiry: a token is reused until four fifths of its lifetime, then
// replaced; the client secret file is read at each request (rotation), in either client
// authentication; a refusal names the client and the provider's error, never the secret.
func TestTokenSourceRefreshesBeforeExpiry(t *testing.T) {
	for _, post := range []bool{false, true} {
		srv, issued := tokenEndpoint(t, "s3cret-one", 100, post)
		secretFile := filepath.Join(t.TempDir(), "secret")
		if err := os.WriteFile(secretFile, []byte("s3cret-one\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		o := config.KafkaOAuth{TokenURL: srv.URL + "/token?key=hidden", ClientID: "outbox-cdc", ClientSecretFile: secretFile, Scope: "kafka"}
		if post {
			o.ClientAuth = "post"
		}
		s := NewTokenSource(o)
		now := time.Now()
		s.now = func() time.Time { return now }
		ctx := context.Background()
		first, err := s.Token(ctx)
		if err != nil {
			t.Fatal(err)
		}
		now = now.Add(79 * time.Second)
		if again, _ := s.Token(ctx); again != first || issued.Load() != 1 {
			t.Fatalf("post=%t: a token within four fifths of its life was replaced (%s, %d issued)", post, again, issued.Load())
		}
		now = now.Add(2 * time.Second)
		if next, _ := s.Token(ctx); next == first || issued.Load() != 2 {
			t.Fatalf("post=%t: the token was not replaced near its end (%s, %d issued)", post, next, issued.Load())
		}
		// The secret rotated in the file but not at the provider: refused, saying why, not the secret.
		if err := os.WriteFile(secretFile, []byte("s3cret-two\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Hour)
		_, err = s.Token(ctx)
		if err == nil || !strings.Contains(err.Error(), "invalid_client") || !strings.Contains(err.Error(), `"outbox-cdc"`) ||
			strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "hidden") {
			t.Fatalf("post=%t: a refused client: %v", post, err)
		}
	}
}

// TestTokenFileIsReadAtEveryAuthentication: a token a sidecar keeps fresh is read again each time.
func TestTokenFileIsReadAtEveryAuthentication(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	s := NewTokenSource(config.KafkaOAuth{TokenFile: file})
	for _, want := range []string{"first.jwt", "second.jwt"} {
		if err := os.WriteFile(file, []byte(want+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if got, err := s.Token(context.Background()); err != nil || got != want {
			t.Fatalf("token %q, %v: want %q", got, err, want)
		}
	}
}

// TestMSKIAMUsesTheAWSChain: the AWS_MSK_IAM mechanism signs its first message with the credentials
// of the standard AWS chain (here the environment) for the broker's region, and carries the access key
// id, never the secret key. MSK itself cannot be reached from here: this is the plumbing.
func TestMSKIAMUsesTheAWSChain(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIAOUTBOXCDCTEST")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "do-not-print-this-secret")
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	m := mskIAM(config.KafkaAWS{Region: "eu-west-1"})
	if m.Name() != "AWS_MSK_IAM" {
		t.Fatalf("mechanism %s", m.Name())
	}
	_, first, err := m.Authenticate(context.Background(), "b-1.orders.abc123.c2.kafka.eu-west-1.amazonaws.com:9098")
	if err != nil {
		t.Fatal(err)
	}
	var msg map[string]string
	if err := json.Unmarshal(first, &msg); err != nil {
		t.Fatalf("first message %s: %v", first, err)
	}
	if !strings.HasPrefix(msg["x-amz-credential"], "AKIAOUTBOXCDCTEST/") || !strings.Contains(msg["x-amz-credential"], "/eu-west-1/kafka-cluster/") ||
		msg["action"] != "kafka-cluster:Connect" || msg["x-amz-signature"] == "" {
		t.Errorf("first message %v", msg)
	}
	if strings.Contains(string(first), "do-not-print-this-secret") {
		t.Error("the secret key is in the message")
	}
}
