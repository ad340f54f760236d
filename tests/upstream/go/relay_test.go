package upstream

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// Upstream's SDK, in port-forward mode, lists the EndpointSlices labelled
// kubernetes.io/service-name=sandbox-router-svc in the SANDBOX's namespace (not in
// agent-sandbox-system), takes the first ready endpoint's targetRef pod and SPDY-forwards a
// local port to that pod's port 8080.
const (
	routerService = "sandbox-router-svc"
	routerPort    = 8080
	relayPod      = "sandbox-router-relay"
	relayLabel    = "agent-sandbox-rs.test/upstream-go-relay"
)

// relayProgram accepts on {pod IP}:8080 and relays each connection, both directions with
// half-close, to ROUTER_HOST:ROUTER_PORT: a stand-in for a router pod in front of a router that
// runs outside the cluster (the router of `sandboxctl dev`, reachable from the sim's pods since
// they share the host's network).
const relayProgram = `
import os, socket, threading
target = (os.environ["ROUTER_HOST"], int(os.environ["ROUTER_PORT"]))
def pipe(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
def serve(conn):
    try:
        upstream = socket.create_connection(target, timeout=10)
        upstream.settimeout(None)
    except OSError:
        conn.close()
        return
    back = threading.Thread(target=pipe, args=(upstream, conn), daemon=True)
    back.start()
    pipe(conn, upstream)
    back.join()
    conn.close()
    upstream.close()
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((os.environ["POD_IP"], 8080))
server.listen(64)
while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
`

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

// ensureRouterEndpoint makes sure upstream's port-forward mode finds a router in namespace: an
// existing sandbox-router-svc is used as it is; otherwise, with SANDBOX_PORT_FORWARD_RELAY=true,
// a relay pod and that Service are created (and removed in t.Cleanup); otherwise the test fails
// saying what upstream expects.
func ensureRouterEndpoint(ctx context.Context, t *testing.T, core kubernetes.Interface, cfg config) {
	t.Helper()
	ready, err := routerEndpointReady(ctx, core, cfg.namespace)
	if err != nil {
		t.Fatalf("listing EndpointSlices of %s in %s: %v", routerService, cfg.namespace, err)
	}
	if ready {
		return
	}
	if !cfg.relay {
		t.Fatalf("no ready endpoint of Service %s in namespace %s: upstream's SDK port-forwards to a "+
			"router pod behind that Service in the sandbox's namespace; deploy one there, or set "+
			"SANDBOX_PORT_FORWARD_RELAY=true (with SANDBOX_ROUTER_URL) to let this test relay to "+
			"SANDBOX_ROUTER_URL from a pod of its own", routerService, cfg.namespace)
	}
	if cfg.routerURL == "" {
		t.Fatalf("SANDBOX_PORT_FORWARD_RELAY=true needs SANDBOX_ROUTER_URL")
	}
	parsed, err := url.Parse(cfg.routerURL)
	if err != nil {
		t.Fatalf("SANDBOX_ROUTER_URL=%s: %v", cfg.routerURL, err)
	}
	host, port, err := net.SplitHostPort(parsed.Host)
	if err != nil {
		t.Fatalf("SANDBOX_ROUTER_URL=%s needs an explicit host:port: %v", cfg.routerURL, err)
	}

	labels := map[string]string{relayLabel: "true"}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: relayPod, Labels: labels},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyAlways,
			Containers: []corev1.Container{{
				Name:    "relay",
				Image:   "python:3",
				Command: []string{"python3", "-c", relayProgram},
				Env: []corev1.EnvVar{
					{Name: "ROUTER_HOST", Value: host},
					{Name: "ROUTER_PORT", Value: port},
					{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{
						FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"},
					}},
				},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: routerPort}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
					TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(routerPort)},
				}},
			}},
		},
	}
	service := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: routerService, Labels: labels},
		Spec: corev1.ServiceSpec{
			Selector: labels,
			Ports: []corev1.ServicePort{{
				Name: "http", Port: routerPort, TargetPort: intstr.FromInt32(routerPort),
			}},
		},
	}
	pods := core.CoreV1().Pods(cfg.namespace)
	services := core.CoreV1().Services(cfg.namespace)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		zero := int64(0)
		if err := services.Delete(ctx, routerService, metav1.DeleteOptions{}); err != nil && !k8serrors.IsNotFound(err) {
			t.Errorf("deleting the relay Service: %v", err)
		}
		if err := pods.Delete(ctx, relayPod, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !k8serrors.IsNotFound(err) {
			t.Errorf("deleting the relay pod: %v", err)
		}
	})
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the relay pod: %v", err)
	}
	if _, err := services.Create(ctx, service, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating Service %s: %v", routerService, err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		return routerEndpointReady(ctx, core, cfg.namespace)
	})
	if err != nil {
		t.Fatalf("%s in %s had no ready endpoint within 60s: %v", routerService, cfg.namespace, err)
	}
	t.Logf("relay pod %s/%s behind %s forwards to %s", cfg.namespace, relayPod, routerService, fmt.Sprintf("%s:%s", host, port))
}
