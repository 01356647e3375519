package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/twmb/franz-go/pkg/sasl"
	saslaws "github.com/twmb/franz-go/pkg/sasl/aws"
	"github.com/twmb/franz-go/pkg/sasl/oauth"

	"github.com/outbox-cdc/outbox-cdc/config"
)

// The managed clusters' mechanisms: SASL/OAUTHBEARER with tokens of an OIDC provider (Confluent
// Cloud, Azure Event Hubs, Aiven, Strimzi's OAuth) and Amazon MSK's IAM access control. Neither
// token nor credential is ever logged.

// TokenSource gives OAUTHBEARER tokens: from an OIDC token endpoint with the client-credentials
// grant, each kept until shortly before it expires, or from a file something else keeps fresh. Safe
// for concurrent use: every connection of a client authenticates through it, and again before the
// broker's connections.max.reauth.ms.
type TokenSource struct {
	o      config.KafkaOAuth
	client *http.Client
	now    func() time.Time

	mu      sync.Mutex
	token   string
	refresh time.Time // when the token is to be replaced: well before it expires
}

// NewTokenSource returns the token source of o.
func NewTokenSource(o config.KafkaOAuth) *TokenSource {
	return &TokenSource{o: o, client: &http.Client{Timeout: 30 * time.Second}, now: time.Now}
}

// Mechanism is the OAUTHBEARER mechanism that takes its tokens from s.
func (s *TokenSource) Mechanism() sasl.Mechanism {
	return oauth.Oauth(func(ctx context.Context) (oauth.Auth, error) {
		token, err := s.Token(ctx)
		if err != nil {
			return oauth.Auth{}, err
		}
		return oauth.Auth{Token: token, Extensions: s.o.Extensions}, nil
	})
}

// Token returns a token that is valid for a while yet, asking the provider for a new one when the
// last is near its end.
func (s *TokenSource) Token(ctx context.Context) (string, error) {
	if s.o.TokenFile != "" {
		data, err := os.ReadFile(s.o.TokenFile)
		if err != nil {
			return "", fmt.Errorf("kafka.sasl.oauth.token_file: %w", err)
		}
		token := strings.TrimSpace(string(data))
		if token == "" {
			return "", fmt.Errorf("kafka.sasl.oauth.token_file: %s is empty", s.o.TokenFile)
		}
		return token, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.token != "" && s.now().Before(s.refresh) {
		return s.token, nil
	}
	token, lifetime, err := s.fetch(ctx)
	if err != nil {
		return "", err
	}
	// Replaced at four fifths of its life (at least 5 s before its end): a connection that
	// authenticates just before the refresh still has a fifth of the lifetime to re-authenticate in.
	ahead := max(lifetime/5, 5*time.Second)
	s.token, s.refresh = token, s.now().Add(max(lifetime-ahead, 0))
	return token, nil
}

// tokenResponse is a token endpoint's answer (RFC 6749 5.1 and 5.2).
type tokenResponse struct {
	AccessToken string          `json:"access_token"`
	ExpiresIn   json.RawMessage `json:"expires_in"`
	Error       string          `json:"error"`
	Description string          `json:"error_description"`
}

// fetch asks the token endpoint for a token with the client-credentials grant and returns it with
// its lifetime (an hour when the endpoint does not say).
func (s *TokenSource) fetch(ctx context.Context) (string, time.Duration, error) {
	secret, err := os.ReadFile(s.o.ClientSecretFile)
	if err != nil {
		return "", 0, fmt.Errorf("kafka.sasl.oauth.client_secret_file: %w", err)
	}
	form := url.Values{"grant_type": {"client_credentials"}}
	if s.o.Scope != "" {
		form.Set("scope", s.o.Scope)
	}
	clientSecret := strings.TrimRight(string(secret), "\r\n")
	if s.o.ClientAuth == "post" {
		form.Set("client_id", s.o.ClientID)
		form.Set("client_secret", clientSecret)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.o.TokenURL, strings.NewReader(form.Encode()))
	if err != nil {
		return "", 0, fmt.Errorf("kafka.sasl.oauth.token_url: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	if s.o.ClientAuth != "post" {
		req.SetBasicAuth(url.QueryEscape(s.o.ClientID), url.QueryEscape(clientSecret))
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return "", 0, fmt.Errorf("ask %s for an OAUTHBEARER token: %w", redactedURL(s.o.TokenURL), err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", 0, fmt.Errorf("read the token from %s: %w", redactedURL(s.o.TokenURL), err)
	}
	var tr tokenResponse
	jerr := json.Unmarshal(body, &tr)
	if resp.StatusCode != http.StatusOK || tr.AccessToken == "" {
		why := resp.Status
		if jerr == nil && tr.Error != "" {
			why += ": " + truncate(tr.Error+" "+tr.Description, 300)
		}
		return "", 0, fmt.Errorf("the token endpoint %s refused the client %q (kafka.sasl.oauth): %s", redactedURL(s.o.TokenURL), s.o.ClientID, why)
	}
	lifetime := time.Hour
	var secs float64
	if len(tr.ExpiresIn) > 0 && json.Unmarshal([]byte(strings.Trim(string(tr.ExpiresIn), `"`)), &secs) == nil && secs > 0 {
		lifetime = time.Duration(secs * float64(time.Second))
	}
	return tr.AccessToken, lifetime, nil
}

// redactedURL is u without a user's password or a query (where an endpoint's key may be).
func redactedURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(kafka.sasl.oauth.token_url)"
	}
	p.User, p.RawQuery = nil, ""
	return p.String()
}

// mskIAM is the AWS_MSK_IAM mechanism, its credentials from the standard AWS chain (environment,
// shared files, web identity/IRSA, ECS and EC2 roles), which the SDK caches and refreshes.
func mskIAM(a config.KafkaAWS) sasl.Mechanism {
	var once sync.Once
	var load func(context.Context) (saslaws.Auth, error)
	return saslaws.ManagedStreamingIAM(func(ctx context.Context) (saslaws.Auth, error) {
		once.Do(func() {
			var opts []func(*awsconfig.LoadOptions) error
			if a.Region != "" {
				opts = append(opts, awsconfig.WithRegion(a.Region))
			}
			cfg, err := awsconfig.LoadDefaultConfig(context.WithoutCancel(ctx), opts...)
			if err != nil {
				load = func(context.Context) (saslaws.Auth, error) {
					return saslaws.Auth{}, fmt.Errorf("AWS_MSK_IAM: load the AWS configuration: %w", err)
				}
				return
			}
			load = func(ctx context.Context) (saslaws.Auth, error) {
				c, err := cfg.Credentials.Retrieve(ctx)
				if err != nil {
					return saslaws.Auth{}, fmt.Errorf("AWS_MSK_IAM: no AWS credentials (environment, shared files, web identity, ECS or EC2 role): %w", err)
				}
				if c.AccessKeyID == "" || c.SecretAccessKey == "" {
					return saslaws.Auth{}, errors.New("AWS_MSK_IAM: the AWS credentials chain gave an empty key")
				}
				return saslaws.Auth{AccessKey: c.AccessKeyID, SecretKey: c.SecretAccessKey, SessionToken: c.SessionToken, UserAgent: "outbox-cdc"}, nil
			}
		})
		return load(ctx)
	})
}
