package upstream

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Upstream's SDK, in port-forward mode, lists the EndpointSlices labelled
// kubernetes.io/service-name=sandbox-router-svc in the SANDBOX's namespace (not in
// agent-sandbox-system), takes the first ready endpoint's targetRef pod and SPDY-forwards a
// local port to that pod's port 8080.
const routerService = "sandbox-router-svc"

// routerEndpointReady reports whether namespace has a ready sandbox-router-svc endpoint with a
// pod targetRef, which is what upstream's port-forward mode needs.
func routerEndpointReady(ctx context.Context, core kubernetes.Interface, namespace string) (bool, error) {
	slices, err := core.DiscoveryV1().EndpointSlices(namespace).List(ctx, metav1.ListOptions{
		LabelSelector: "kubernetes.io/service-name=" + routerService,
	})
	if err != nil {
		return false, err
	}
	for _, slice := range slices.Items {
		for _, ep := range slice.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			if ep.TargetRef != nil && ep.TargetRef.Name != "" {
				return true, nil
			}
		}
	}
	return false, nil
}

// ensureRouterEndpoint fails the test, saying what upstream's SDK expects, unless namespace has
// a ready sandbox-router-svc endpoint (our deploy/sandboxes/namespace-router provides one).
func ensureRouterEndpoint(ctx context.Context, t *testing.T, core kubernetes.Interface, cfg config) {
	t.Helper()
	ready, err := routerEndpointReady(ctx, core, cfg.namespace)
	if err != nil {
		t.Fatalf("listing EndpointSlices of %s in %s: %v", routerService, cfg.namespace, err)
	}
	if !ready {
		t.Fatalf("no ready endpoint of Service %s in namespace %s: upstream's SDK port-forwards to a "+
			"router pod behind that Service in the sandbox's namespace; install "+
			"deploy/sandboxes/namespace-router there", routerService, cfg.namespace)
	}
}
