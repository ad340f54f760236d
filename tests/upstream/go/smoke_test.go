// Package upstream runs upstream's own Go SDK against this project's system.
//
// The SDK is sigs.k8s.io/agent-sandbox/clients/go/sandbox from module sigs.k8s.io/agent-sandbox
// pinned at v1.0.3 (go.mod): the newest version the Go module proxy serves to this project's
// machines; v1.0.4 and later are refused there with 403.
package upstream

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"

	"sigs.k8s.io/agent-sandbox/clients/go/sandbox"
	extensionsclientset "sigs.k8s.io/agent-sandbox/clients/k8s/extensions/clientset/versioned"
	extv1beta1client "sigs.k8s.io/agent-sandbox/clients/k8s/extensions/clientset/versioned/typed/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
)

// Bounds of the whole flow and of its steps.
const (
	flowTimeout    = 4 * time.Minute
	cleanupTimeout = 30 * time.Second
	claimGone      = 30 * time.Second
	// shutdownUpdates is how many Get+modify+Update rounds push the claim's expiry.
	shutdownUpdates = 5
)

// The runtime's legacy /execute splits the command with shlex rules and runs it WITHOUT a shell
// (docs/runtime-api.md, "POST /execute": "The string is split with Python's shlex.split rules
// and run **without a shell**"), so `$(hostname)` reaches echo as a literal word.
const (
	helloCommand = "echo hello from $(hostname)"
	helloOutput  = "hello from $(hostname)\n"
)

type cluster struct {
	rest   *rest.Config
	core   kubernetes.Interface
	claims extv1beta1client.SandboxClaimInterface
}

func connect(t *testing.T, cfg config) cluster {
	t.Helper()
	restConfig, err := clientcmd.BuildConfigFromFlags("", cfg.kubeconfig)
	if err != nil {
		t.Fatalf("loading KUBECONFIG=%s: %v", cfg.kubeconfig, err)
	}
	restConfig.Timeout = 30 * time.Second
	// client-go's typed clients of built-in kinds send protobuf bodies unless told otherwise;
	// the simulated cluster decodes only JSON (the SDK writes only custom resources, always
	// JSON, and keeps its own defaults: it gets restConfig untouched).
	jsonConfig := rest.CopyConfig(restConfig)
	jsonConfig.ContentType = "application/json"
	jsonConfig.AcceptContentTypes = "application/json"
	core, err := kubernetes.NewForConfig(jsonConfig)
	if err != nil {
		t.Fatal(err)
	}
	// Watches must outlive the per-request timeout.
	watchConfig := rest.CopyConfig(restConfig)
	watchConfig.Timeout = 0
	ext, err := extensionsclientset.NewForConfig(watchConfig)
	if err != nil {
		t.Fatal(err)
	}
	return cluster{rest: restConfig, core: core, claims: ext.ExtensionsV1beta1().SandboxClaims(cfg.namespace)}
}

func TestUpstreamGoSDK(t *testing.T) {
	cfg := loadConfig(t)
	c := connect(t, cfg)

	t.Run("port-forward", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), flowTimeout)
		defer cancel()
		ensureRouterEndpoint(ctx, t, c.core, cfg)
		smoke(ctx, t, c, cfg, "port-forward", "")
	})
	t.Run("direct", func(t *testing.T) {
		if cfg.routerURL == "" {
			requirement(t, "SANDBOX_ROUTER_URL is not set: direct-URL mode needs the router's URL")
		}
		ctx, cancel := context.WithTimeout(context.Background(), flowTimeout)
		defer cancel()
		smoke(ctx, t, c, cfg, "direct", cfg.routerURL)
	})
}

// smoke runs the flow through upstream's SDK in one connection mode (apiURL "" is the SDK's
// default, port-forward).
func smoke(ctx context.Context, t *testing.T, c cluster, cfg config, mode, apiURL string) {
	auth := newRouterAuth(cfg)
	t.Cleanup(auth.closeIdle)
	client, err := sandbox.NewClient(ctx, sandbox.Options{
		RestConfig:              c.rest,
		APIURL:                  apiURL,
		HTTPTransport:           auth,
		SandboxReadyTimeout:     90 * time.Second,
		PortForwardReadyTimeout: 30 * time.Second,
		RequestTimeout:          60 * time.Second,
		PerAttemptTimeout:       30 * time.Second,
		CleanupTimeout:          cleanupTimeout,
	})
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}

	// Push the expiry of the claim the moment it appears, while the controller binds it.
	early := watchNewClaim(ctx, t, c.claims)

	start := time.Now()
	sb, err := client.CreateSandbox(ctx, cfg.warmPool, cfg.namespace)
	if err != nil {
		t.Fatalf("CreateSandbox(%s/%s): %v", cfg.namespace, cfg.warmPool, err)
	}
	latency := time.Since(start)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		if err := sb.Close(ctx); err != nil {
			t.Errorf("cleanup: Close: %v", err)
		}
	})
	fmt.Printf("claim-to-ready (%s): %.1f ms\n", mode, float64(latency.Microseconds())/1000)
	claimName := sb.ClaimName()
	t.Logf("claim %s, sandbox %s, pod %s (%s)", claimName, sb.SandboxName(), sb.PodName(), sb.PodIP())

	select {
	case result := <-early:
		if result.err != nil {
			t.Fatalf("pushing the expiry of the new claim: %v", result.err)
		}
		if result.name != claimName {
			t.Fatalf("the first new claim was %s, not the SDK's %s", result.name, claimName)
		}
		fmt.Printf("shutdownTime update at creation (%s): %d conflicts retried\n", mode, result.conflicts)
	case <-ctx.Done():
		t.Fatalf("no update of the new claim: %v", ctx.Err())
	}

	conflicts, want, err := pushShutdownTime(ctx, c.claims, claimName, shutdownUpdates)
	if err != nil {
		t.Fatalf("pushing spec.lifecycle.shutdownTime: %v", err)
	}
	fmt.Printf("shutdownTime updates (%s): %d rounds, %d conflicts retried\n", mode, shutdownUpdates, conflicts)
	claim, err := c.claims.Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Spec.Lifecycle == nil || claim.Spec.Lifecycle.ShutdownTime == nil || !claim.Spec.Lifecycle.ShutdownTime.Equal(&want) {
		t.Fatalf("spec.lifecycle after the updates is %+v, want shutdownTime %s", claim.Spec.Lifecycle, want.UTC().Format(time.RFC3339))
	}

	run(ctx, t, sb, helloCommand, helloOutput)

	files(ctx, t, sb)

	if err := sb.Disconnect(ctx); err != nil {
		t.Fatalf("Disconnect: %v", err)
	}
	if sb.IsReady() {
		t.Fatalf("IsReady after Disconnect")
	}
	if _, err := c.claims.Get(ctx, claimName, metav1.GetOptions{}); err != nil {
		t.Fatalf("the claim did not survive Disconnect: %v", err)
	}
	if err := sb.Open(ctx); err != nil {
		t.Fatalf("Open after Disconnect: %v", err)
	}
	if sb.ClaimName() != claimName {
		t.Fatalf("Open after Disconnect attached to %s, not %s", sb.ClaimName(), claimName)
	}
	run(ctx, t, sb, "echo reconnected", "reconnected\n")
	if got, err := sb.Read(ctx, "smoke.txt"); err != nil || string(got) != smokeText {
		t.Fatalf("Read after reconnecting: %q, %v", got, err)
	}

	if err := sb.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, claimGone, true, func(ctx context.Context) (bool, error) {
		_, err := c.claims.Get(ctx, claimName, metav1.GetOptions{})
		if k8serrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if err != nil {
		t.Fatalf("SandboxClaim %s still there %s after Close: %v", claimName, claimGone, err)
	}
}

func run(ctx context.Context, t *testing.T, sb *sandbox.Sandbox, command, stdout string) {
	t.Helper()
	result, err := sb.Run(ctx, command)
	if err != nil {
		t.Fatalf("Run(%q): %v", command, err)
	}
	if result.Stdout != stdout || result.Stderr != "" || result.ExitCode != 0 {
		t.Fatalf("Run(%q) = stdout %q, stderr %q, exit %d; want stdout %q, no stderr, exit 0",
			command, result.Stdout, result.Stderr, result.ExitCode, stdout)
	}
}

const smokeText = "hello from upstream's Go SDK\n"

func files(ctx context.Context, t *testing.T, sb *sandbox.Sandbox) {
	t.Helper()
	// Every byte value, NUL and invalid UTF-8 included, and more than one read buffer.
	binary := make([]byte, 256*1024+3)
	for i := range binary {
		binary[i] = byte((i * 2654435761) >> 13)
	}
	written := map[string][]byte{"smoke.txt": []byte(smokeText), "blob.bin": binary}
	for name, content := range written {
		if err := sb.Write(ctx, name, content); err != nil {
			t.Fatalf("Write(%s): %v", name, err)
		}
		got, err := sb.Read(ctx, name)
		if err != nil {
			t.Fatalf("Read(%s): %v", name, err)
		}
		if !bytes.Equal(got, content) {
			t.Fatalf("Read(%s) gave %d bytes that differ from the %d written", name, len(got), len(content))
		}
	}

	entries, err := sb.List(ctx, ".")
	if err != nil {
		t.Fatalf("List(.): %v", err)
	}
	listed := map[string]sandbox.FileEntry{}
	var names []string
	for _, entry := range entries {
		listed[entry.Name] = entry
		names = append(names, entry.Name)
	}
	sort.Strings(names)
	for name, content := range written {
		entry, ok := listed[name]
		if !ok {
			t.Fatalf("List(.) = %v, without %s", names, name)
		}
		if entry.Type != sandbox.FileTypeFile || entry.Size != int64(len(content)) {
			t.Fatalf("List(.) entry %s = %+v, want a file of %d bytes", name, entry, len(content))
		}
		if age := time.Since(entry.ModTime); age < -time.Minute || age > 10*time.Minute {
			t.Fatalf("List(.) entry %s has mod time %s", name, entry.ModTime)
		}
	}

	for path, want := range map[string]bool{"smoke.txt": true, "blob.bin": true, "no-such-file.txt": false} {
		got, err := sb.Exists(ctx, path)
		if err != nil {
			t.Fatalf("Exists(%s): %v", path, err)
		}
		if got != want {
			t.Fatalf("Exists(%s) = %v, want %v", path, got, want)
		}
	}
}

type earlyUpdate struct {
	name      string
	conflicts int
	err       error
}

// watchNewClaim watches for the next SandboxClaim created in the namespace and, as soon as it
// is seen, pushes its shutdownTime once (while the controller is binding it).
func watchNewClaim(ctx context.Context, t *testing.T, claims extv1beta1client.SandboxClaimInterface) <-chan earlyUpdate {
	t.Helper()
	list, err := claims.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("listing SandboxClaims: %v", err)
	}
	watcher, err := claims.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatalf("watching SandboxClaims: %v", err)
	}
	existing := map[string]bool{}
	for _, claim := range list.Items {
		existing[claim.Name] = true
	}
	out := make(chan earlyUpdate, 1)
	go func() {
		defer watcher.Stop()
		for {
			select {
			case <-ctx.Done():
				out <- earlyUpdate{err: ctx.Err()}
				return
			case event, ok := <-watcher.ResultChan():
				if !ok {
					out <- earlyUpdate{err: fmt.Errorf("the SandboxClaim watch ended before a new claim appeared")}
					return
				}
				claim, isClaim := event.Object.(*extv1beta1.SandboxClaim)
				if event.Type != watch.Added || !isClaim || existing[claim.Name] {
					continue
				}
				conflicts, _, err := pushShutdownTime(ctx, claims, claim.Name, 1)
				out <- earlyUpdate{name: claim.Name, conflicts: conflicts, err: err}
				return
			}
		}
	}()
	return out
}

// pushShutdownTime moves spec.lifecycle.shutdownTime of the claim forward in `rounds` rounds of
// Get+modify+Update, each retried on 409 Conflict; it returns how many conflicts were retried
// and the last time written.
func pushShutdownTime(ctx context.Context, claims extv1beta1client.SandboxClaimInterface, name string, rounds int) (int, metav1.Time, error) {
	conflicts := 0
	var last metav1.Time
	for round := range rounds {
		// Whole seconds: metav1.Time is serialised as RFC 3339 without fractions.
		target := metav1.NewTime(time.Now().Add(30*time.Minute + time.Duration(round)*time.Minute).Truncate(time.Second))
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			claim, err := claims.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if claim.Spec.Lifecycle == nil {
				claim.Spec.Lifecycle = &extv1beta1.Lifecycle{}
			}
			claim.Spec.Lifecycle.ShutdownTime = &target
			// Leave the controller time to write the claim in between, so that a stale
			// resourceVersion (and so a conflict) can really happen.
			time.Sleep(time.Duration(round%3) * 20 * time.Millisecond)
			_, err = claims.Update(ctx, claim, metav1.UpdateOptions{})
			if k8serrors.IsConflict(err) {
				conflicts++
			}
			return err
		})
		if err != nil {
			return conflicts, last, fmt.Errorf("round %d: %w", round+1, err)
		}
		last = target
	}
	return conflicts, last, nil
}
