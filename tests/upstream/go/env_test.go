package upstream

import (
	"os"
	"strings"
	"testing"
)

// config is the environment contract of this test (see README.md).
type config struct {
	kubeconfig  string
	namespace   string
	warmPool    string
	routerURL   string
	routerToken string
	signingKey  []byte
}

// inCI reports whether the test runs in CI, where a missing requirement fails the test
// instead of skipping it.
func inCI() bool {
	return os.Getenv("CI") == "true"
}

// requirement skips the test (or fails it under CI=true) with why it cannot run.
func requirement(t *testing.T, why string) {
	t.Helper()
	if inCI() {
		t.Fatalf("cannot run under CI=true: %s", why)
	}
	t.Skipf("skipped: %s", why)
}

func getenv(name, fallback string) string {
	if value := strings.TrimSpace(os.Getenv(name)); value != "" {
		return value
	}
	return fallback
}

// loadConfig reads the environment; it skips (or fails under CI=true) when KUBECONFIG is
// missing, and fails on a configuration that cannot be used.
func loadConfig(t *testing.T) config {
	t.Helper()
	cfg := config{
		kubeconfig:  getenv("KUBECONFIG", ""),
		namespace:   getenv("SANDBOX_NAMESPACE", "default"),
		warmPool:    getenv("SANDBOX_WARM_POOL", "python-sandbox-pool"),
		routerURL:   getenv("SANDBOX_ROUTER_URL", ""),
		routerToken: getenv("SANDBOX_ROUTER_TOKEN", ""),
	}
	if cfg.kubeconfig == "" {
		requirement(t, "KUBECONFIG is not set: point it at an admin kubeconfig of a cluster "+
			"with agent-sandbox installed (e.g. the one `sandboxctl dev --kubeconfig-out` writes)")
	}
	if _, err := os.Stat(cfg.kubeconfig); err != nil {
		t.Fatalf("KUBECONFIG=%s cannot be read: %v", cfg.kubeconfig, err)
	}
	if path := getenv("SANDBOX_ROUTER_SIGNING_KEY_FILE", ""); path != "" {
		if cfg.routerToken != "" {
			t.Fatalf("set only one of SANDBOX_ROUTER_TOKEN and SANDBOX_ROUTER_SIGNING_KEY_FILE")
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("SANDBOX_ROUTER_SIGNING_KEY_FILE=%s cannot be read: %v", path, err)
		}
		// docs/router.md "Authentication": the key is the file's bytes without surrounding
		// whitespace.
		cfg.signingKey = []byte(strings.TrimSpace(string(raw)))
		if len(cfg.signingKey) == 0 {
			t.Fatalf("SANDBOX_ROUTER_SIGNING_KEY_FILE=%s is empty", path)
		}
	}
	return cfg
}
