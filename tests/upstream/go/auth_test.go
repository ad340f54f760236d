package upstream

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// The routing headers upstream's Go SDK sets on every request through the router
// (clients/go/sandbox/types.go: headerSandboxID, headerSandboxNamespace).
const (
	headerSandboxID        = "X-Sandbox-ID"
	headerSandboxNamespace = "X-Sandbox-Namespace"
)

// scopedTokenTTL is how long a minted token is valid; one is minted per request.
const scopedTokenTTL = 5 * time.Minute

// scopedClaims is the payload of a v1 scoped token, fields in this order (docs/router.md,
// "Authentication").
type scopedClaims struct {
	Namespace string `json:"ns"`
	Name      string `json:"name"`
	Expiry    int64  `json:"exp"`
}

// mintScopedToken returns
// v1.<b64url(JSON claims)>.<b64url(HMAC-SHA256(key, "agent-sandbox/scoped-token/v1." + payload))>
// with base64url unpadded.
func mintScopedToken(key []byte, namespace, name string, expiry time.Time) (string, error) {
	body, err := json.Marshal(scopedClaims{Namespace: namespace, Name: name, Expiry: expiry.Unix()})
	if err != nil {
		return "", err
	}
	payload := base64.RawURLEncoding.EncodeToString(body)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("agent-sandbox/scoped-token/v1." + payload))
	return "v1." + payload + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil)), nil
}

// routerAuth is the http.RoundTripper given to the SDK as Options.HTTPTransport: upstream's
// SDK sends no router credentials itself. It adds `Authorization: Bearer` with the static
// token, or with a scoped token minted for the sandbox the request's routing headers name;
// with neither configured it sends nothing.
type routerAuth struct {
	base       http.RoundTripper
	token      string
	signingKey []byte

	requests atomic.Int64
}

func newRouterAuth(cfg config) *routerAuth {
	return &routerAuth{
		base: &http.Transport{
			DialContext:           (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
			MaxIdleConnsPerHost:   4,
			IdleConnTimeout:       30 * time.Second,
			ResponseHeaderTimeout: 60 * time.Second,
		},
		token:      cfg.routerToken,
		signingKey: cfg.signingKey,
	}
}

func (a *routerAuth) RoundTrip(req *http.Request) (*http.Response, error) {
	a.requests.Add(1)
	token := a.token
	if a.signingKey != nil {
		name := req.Header.Get(headerSandboxID)
		namespace := req.Header.Get(headerSandboxNamespace)
		if name == "" || namespace == "" {
			if req.Body != nil {
				_ = req.Body.Close()
			}
			return nil, fmt.Errorf("cannot mint a scoped token: the SDK's request %s %s has no %s/%s headers",
				req.Method, req.URL.Path, headerSandboxID, headerSandboxNamespace)
		}
		minted, err := mintScopedToken(a.signingKey, namespace, name, time.Now().Add(scopedTokenTTL))
		if err != nil {
			if req.Body != nil {
				_ = req.Body.Close()
			}
			return nil, err
		}
		token = minted
	}
	if token != "" {
		// A RoundTripper must not modify the caller's request.
		req = req.Clone(req.Context())
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return a.base.RoundTrip(req)
}

func (a *routerAuth) closeIdle() {
	if t, ok := a.base.(*http.Transport); ok {
		t.CloseIdleConnections()
	}
}
