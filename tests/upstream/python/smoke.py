#!/usr/bin/env python3
"""Smoke test: upstream's Python SDK (PyPI k8s-agent-sandbox, pinned in requirements.txt)
against this repository's controller, router and runtime.

Runs the same scenario once per connection mode of the SDK:

- ``tunnel``: the SDK's default (``SandboxLocalTunnelConnectionConfig``). The SDK runs
  ``kubectl get svc/sandbox-router-svc -n agent-sandbox-system`` as a pre-flight check, then
  spawns ``kubectl port-forward svc/sandbox-router-svc <free local port>:8080 -n
  agent-sandbox-system`` (a subprocess; ``kubectl`` from ``PATH``, the ambient kubeconfig) per
  sandbox handle and sends the router headers to ``http://127.0.0.1:<port>``.
- ``direct``: ``SandboxDirectConnectionConfig(api_url=SANDBOX_ROUTER_URL)``.

Environment (empty counts as unset):

  KUBECONFIG                       admin kubeconfig (required; without it: skipped, exit 0,
                                   but exit 1 when CI=true)
  SANDBOX_NAMESPACE                namespace of the claim (default ``default``)
  SANDBOX_WARM_POOL                SandboxWarmPool to claim from (default ``python-sandbox-pool``)
  SANDBOX_ROUTER_URL               router URL for the direct mode
  SANDBOX_ROUTER_TOKEN             static bearer token for the router (``--auth token``)
  SANDBOX_ROUTER_SIGNING_KEY_FILE  router signing key (``--auth scoped``): a scoped token is
                                   minted per request for the sandbox that request addresses
  SANDBOX_MODES                    comma-separated modes to run (default ``tunnel,direct``)
  SANDBOX_SMOKE_TIMEOUT            seconds one mode may take in all (default 240)
  SANDBOX_SMOKE_VERBOSE            ``1``: the SDK's INFO logs on stderr
  CI                               ``true``: a skipped mode or a missing prerequisite fails

Exit code: 0 when every requested mode passed (or was skipped outside CI), 1 otherwise.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import io
import json
import logging
import os
import shutil
import signal
import sys
import time
import traceback
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

MODES = ("tunnel", "direct")
DEFAULT_MODES = ("tunnel", "direct")
TUNNEL_MODES = ("tunnel",)
CLAIM_GROUP = "extensions.agents.x-k8s.io"
SANDBOX_GROUP = "agents.x-k8s.io"
API_VERSION = "v1beta1"
# Where upstream's SDK (and our deploy/base) expects the router for the tunnel mode.
ROUTER_NAMESPACE = "agent-sandbox-system"
ROUTER_SERVICE = "sandbox-router-svc"
K8S_TIMEOUT = 10  # seconds, every Kubernetes API call made by this script
HTTP_TIMEOUT = 30  # seconds, every SDK call to the router
TOKEN_TTL = 120  # seconds, lifetime of each minted scoped token
SCOPED_TOKEN_CONTEXT = b"agent-sandbox/scoped-token/v1."
SHUTDOWN_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value else default


def ci() -> bool:
    return (env("CI") or "").lower() == "true"


class Skipped(Exception):
    """A prerequisite of a mode is missing."""


class ModeTimeout(Exception):
    """The per-mode watchdog fired."""


def log(message: str) -> None:
    print(message, flush=True)


def check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def wait_until(what: str, timeout: float, probe: Callable[[], bool], interval: float = 0.2) -> float:
    """Polls ``probe`` until it is true; returns the seconds waited, raises after ``timeout``."""
    start = time.monotonic()
    while True:
        if probe():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what}: not done within {timeout:.0f} s")
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------
# Router authentication


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def mint_scoped_token(key: bytes, namespace: str, sandbox: str, exp: int) -> str:
    """A v1 scoped token as docs/router.md ("Authentication") specifies it."""
    payload = b64url(
        json.dumps({"ns": namespace, "name": sandbox, "exp": exp}, separators=(",", ":")).encode()
    )
    signature = hmac.new(key, SCOPED_TOKEN_CONTEXT + payload.encode("ascii"), hashlib.sha256)
    return f"v1.{payload}.{b64url(signature.digest())}"


def make_router_auth(static_token: str | None, key: bytes | None):
    """A ``requests`` auth hook setting ``Authorization`` on every request the SDK prepares.

    Upstream's SDK has no per-request header or transport hook: only
    ``SandboxDirectConnectionConfig.extra_headers`` (one static set for every sandbox of a
    client, direct mode only; the tunnel config has none). Each sandbox handle owns
    ``requests.Session`` objects (``handle.connector.session``, and a second one without
    retries for streamed uploads); ``Session.auth`` is requests' documented per-request hook,
    and it sees the final headers, ``X-Sandbox-ID``/``X-Sandbox-Namespace`` included, so a
    scoped token is minted for exactly the sandbox each request addresses.
    """
    import requests

    class RouterAuth(requests.auth.AuthBase):
        def __init__(self) -> None:
            self.requests = 0
            self.minted = 0

        def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
            self.requests += 1
            if static_token is not None:
                token = static_token
            else:
                assert key is not None
                sandbox = request.headers.get("X-Sandbox-ID")
                namespace = request.headers.get("X-Sandbox-Namespace") or "default"
                if not sandbox:
                    return request  # not a routed request: nothing to mint for
                token = mint_scoped_token(key, namespace, sandbox, int(time.time()) + TOKEN_TTL)
                self.minted += 1
            request.headers["Authorization"] = f"Bearer {token}"
            return request

    return RouterAuth()


def install_auth(handle: Any, auth: Any) -> int:
    """Puts ``auth`` on every ``requests.Session`` of a sandbox handle's connector."""
    import requests

    if auth is None:
        return 0
    sessions = [v for v in vars(handle.connector).values() if isinstance(v, requests.Session)]
    check(bool(sessions), "the SDK's connector holds no requests.Session to authenticate")
    for session in sessions:
        session.auth = auth
    return len(sessions)


# ---------------------------------------------------------------------------------------------
# Kubernetes API (the kubernetes client the SDK depends on)


class Kube:
    def __init__(self) -> None:
        from kubernetes import client, config

        config.load_kube_config()
        self.api = client.CustomObjectsApi()
        self.core = client.CoreV1Api()
        self.ApiException = client.ApiException

    def _claim_args(self, namespace: str) -> dict[str, Any]:
        return dict(group=CLAIM_GROUP, version=API_VERSION, namespace=namespace,
                    plural="sandboxclaims")

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.api.get_namespaced_custom_object(
                name=name, _request_timeout=K8S_TIMEOUT, **self._claim_args(namespace))
        except self.ApiException as error:
            if error.status == 404:
                return None
            raise

    def replace_claim(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.api.replace_namespaced_custom_object(
            name=body["metadata"]["name"], body=body, _request_timeout=K8S_TIMEOUT,
            **self._claim_args(namespace))

    def delete_claim(self, namespace: str, name: str) -> None:
        try:
            self.api.delete_namespaced_custom_object(
                name=name, _request_timeout=K8S_TIMEOUT, **self._claim_args(namespace))
        except self.ApiException as error:
            if error.status != 404:
                raise

    def get_sandbox(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.api.get_namespaced_custom_object(
                group=SANDBOX_GROUP, version=API_VERSION, namespace=namespace,
                plural="sandboxes", name=name, _request_timeout=K8S_TIMEOUT)
        except self.ApiException as error:
            if error.status == 404:
                return None
            raise

    def router_service_exists(self) -> bool:
        try:
            self.core.read_namespaced_service(
                ROUTER_SERVICE, ROUTER_NAMESPACE, _request_timeout=K8S_TIMEOUT)
            return True
        except self.ApiException as error:
            if error.status == 404:
                return False
            raise


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def extend_claim(kube: Kube, namespace: str, name: str, by: timedelta,
                 start_from: dict[str, Any] | None = None, max_retries: int = 10) -> tuple[str, int]:
    """Read-modify-write of ``spec.lifecycle.shutdownTime`` (pushed ``by`` past the later of
    now and its current value), retried on 409 Conflict. ``start_from`` is a claim as read
    earlier (possibly stale: its resourceVersion then makes the first write conflict).
    Returns the time written and the number of 409 retries."""
    retries = 0
    claim = start_from if start_from is not None else kube.get_claim(namespace, name)
    while True:
        check(claim is not None, f"SandboxClaim {namespace}/{name} disappeared while extending")
        assert claim is not None
        spec = claim.setdefault("spec", {})
        lifecycle = dict(spec.get("lifecycle") or {})
        now = datetime.now(timezone.utc)
        current = parse_time(lifecycle.get("shutdownTime")) or now
        new_time = (max(current, now) + by).strftime(SHUTDOWN_FORMAT)
        lifecycle["shutdownTime"] = new_time
        lifecycle.setdefault("shutdownPolicy", "Delete")
        spec["lifecycle"] = lifecycle
        try:
            kube.replace_claim(namespace, claim)
            return new_time, retries
        except kube.ApiException as error:
            if error.status != 409 or retries >= max_retries:
                raise
            retries += 1
            claim = kube.get_claim(namespace, name)


# ---------------------------------------------------------------------------------------------
# One mode


def connection_config(mode: str, router_url: str | None, static_token: str | None):
    from k8s_agent_sandbox.models import (
        SandboxDirectConnectionConfig,
        SandboxLocalTunnelConnectionConfig,
    )

    if mode in TUNNEL_MODES:
        return SandboxLocalTunnelConnectionConfig(router_namespace=ROUTER_NAMESPACE)
    headers = {"Authorization": f"Bearer {static_token}"} if static_token else {}
    return SandboxDirectConnectionConfig(api_url=router_url, extra_headers=headers)


def check_prerequisites(mode: str, kube: Kube, router_url: str | None) -> None:
    if mode == "tunnel":
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            raise Skipped("the tunnel mode runs `kubectl port-forward`: put kubectl on PATH")
        if not kube.router_service_exists():
            # Not fatal here: the SDK is left to fail (or not) on its own pre-flight check.
            log(f"  note: Service {ROUTER_NAMESPACE}/{ROUTER_SERVICE} does not exist; the SDK's "
                f"tunnel mode port-forwards to it (`kubectl port-forward svc/{ROUTER_SERVICE} "
                f"<port>:8080 -n {ROUTER_NAMESPACE}`)")
    elif mode == "direct" and not router_url:
        raise Skipped(f"the {mode} mode needs SANDBOX_ROUTER_URL")


def tunnel_process(handle: Any) -> Any:
    """The `kubectl port-forward` process of a tunnel-mode handle (None when closed)."""
    return getattr(handle.connector.strategy, "port_forward_process", None)


def run_mode(mode: str, kube: Kube, settings: dict[str, Any]) -> None:
    router_url: str | None = settings["router_url"]
    check_prerequisites(mode, kube, router_url)
    run_scenario(mode, kube, settings)


def run_scenario(mode: str, kube: Kube, settings: dict[str, Any]) -> None:
    from k8s_agent_sandbox import SandboxClient

    namespace: str = settings["namespace"]
    pool: str = settings["pool"]
    router_url: str | None = settings["router_url"]
    static_token: str | None = settings["token"]
    key: bytes | None = settings["key"]
    tunnel = mode in TUNNEL_MODES

    # Direct mode with a static token uses the SDK's documented `extra_headers`; every other
    # authenticated case needs the session hook (see make_router_auth).
    needs_hook = key is not None or (static_token is not None and tunnel)
    auth = make_router_auth(static_token if tunnel else None, key) if needs_hook else None

    client = SandboxClient(connection_config=connection_config(mode, router_url, static_token))
    handles: list[Any] = []
    claim_name: str | None = None
    try:
        # --- claim from the warm pool -----------------------------------------------------
        start = time.monotonic()
        sandbox = client.create_sandbox(
            warmpool=pool, namespace=namespace, sandbox_ready_timeout=60,
            shutdown_after_seconds=600)
        elapsed_ms = (time.monotonic() - start) * 1000
        handles.append(sandbox)
        claim_name = sandbox.claim_name
        log(f"claim-to-ready ({mode}): {elapsed_ms:.1f} ms")
        log(f"  claim {namespace}/{claim_name} -> sandbox {sandbox.sandbox_id}")
        install_auth(sandbox, auth)

        # --- a command --------------------------------------------------------------------
        start = time.monotonic()
        result = sandbox.commands.run("echo hello from $(hostname)", timeout=HTTP_TIMEOUT)
        log(f"exec ({mode}): {(time.monotonic() - start) * 1000:.1f} ms")
        log(f"  stdout {result.stdout!r} stderr {result.stderr!r} exit_code {result.exit_code}")
        # The SDK calls the runtime's upstream-compatible `POST /execute`, which splits the
        # command with shlex rules and runs it without a shell: `$(hostname)` arrives as a
        # literal argument and echo prints it verbatim (docs/runtime-api.md, "POST /execute";
        # docs/gotchas.md §4 "`/execute` is not a shell").
        check(result.stdout == "hello from $(hostname)\n",
              f"/execute printed {result.stdout!r}, not the literal 'hello from $(hostname)\\n'")
        check(result.exit_code == 0 and result.stderr == "" and not result.timed_out,
              f"echo did not succeed cleanly: {result!r}")
        first_tunnel = tunnel_process(sandbox) if tunnel else None
        if tunnel:
            check(first_tunnel is not None and first_tunnel.poll() is None,
                  "no running `kubectl port-forward` behind the tunnel handle")
            log(f"  tunnel: kubectl port-forward pid {first_tunnel.pid}, "
                f"{sandbox.connector.strategy.base_url}")

        # Exit codes pass through (docs/runtime-api.md: the process's own code).
        failed = sandbox.commands.run("sh -c 'exit 3'", timeout=HTTP_TIMEOUT)
        check(failed.exit_code == 3, f"`exit 3` gave exit code {failed.exit_code}")
        # The newest SDK sends `timeout_seconds` (its `command_timeout`); the runtime kills the
        # group and answers 124 with `timed_out` (docs/runtime-api.md, extension fields).
        timed = sandbox.commands.run("sleep 30", timeout=HTTP_TIMEOUT, command_timeout=1)
        check(timed.timed_out and timed.exit_code == 124,
              f"`sleep 30` with command_timeout=1 was not timed out: {timed!r}")
        log(f"  exit 3 -> {failed.exit_code}; sleep 30 with command_timeout=1 -> "
            f"exit {timed.exit_code}, timed_out {timed.timed_out}")

        # --- files ------------------------------------------------------------------------
        text = f"hello from the upstream Python SDK, {mode} mode\n"
        binary = bytes(range(256)) * 64 + b"\x00\r\n\xff" + os.urandom(4096)
        streamed = os.urandom(200_000)
        sandbox.files.write("smoke/hello.txt", text, timeout=HTTP_TIMEOUT)
        sandbox.files.write("smoke/data.bin", binary, timeout=HTTP_TIMEOUT)
        # A file object is streamed as multipart without retries (the SDK's second session).
        sandbox.files.write("smoke/nested/streamed.bin", io.BytesIO(streamed), timeout=HTTP_TIMEOUT)
        check(sandbox.files.read("smoke/hello.txt", timeout=HTTP_TIMEOUT) == text.encode(),
              "smoke/hello.txt read back differs")
        check(sandbox.files.read("smoke/data.bin", timeout=HTTP_TIMEOUT) == binary,
              "smoke/data.bin read back differs")
        sink = io.BytesIO()
        count = sandbox.files.read_to("smoke/nested/streamed.bin", sink, timeout=HTTP_TIMEOUT)
        check(count == len(streamed) and sink.getvalue() == streamed,
              "smoke/nested/streamed.bin streamed back differs")
        entries = {e.name: e for e in sandbox.files.list("smoke", timeout=HTTP_TIMEOUT)}
        check(set(entries) == {"hello.txt", "data.bin", "nested"},
              f"list smoke: {sorted(entries)}")
        check(entries["data.bin"].type == "file" and entries["data.bin"].size == len(binary)
              and entries["nested"].type == "directory",
              f"list smoke entries: {entries}")
        check(sandbox.files.exists("smoke/data.bin", timeout=HTTP_TIMEOUT) is True,
              "exists(smoke/data.bin) is not True")
        check(sandbox.files.exists("smoke/missing.bin", timeout=HTTP_TIMEOUT) is False,
              "exists(smoke/missing.bin) is not False")
        log(f"  files: wrote/read {len(text)} B text, {len(binary)} B binary, "
            f"{len(streamed)} B streamed; list {sorted(entries)}; exists true/false ok")

        if mode == "direct" and (key is not None or static_token is not None):
            # The router refuses the same request without the hook's token: the hook (or
            # extra_headers) is what authenticates the SDK, not some bypass.
            import requests

            refused = requests.post(
                f"{router_url.rstrip('/')}/execute", json={"command": "true"}, timeout=10,
                headers={"X-Sandbox-ID": sandbox.sandbox_id, "X-Sandbox-Namespace": namespace})
            check(refused.status_code == 401,
                  f"an unauthenticated request got {refused.status_code}, not 401")
            log("  router: 401 without a token, as expected")

        # --- push the claim's shutdown time -----------------------------------------------
        before = kube.get_claim(namespace, claim_name)
        check(before is not None, f"SandboxClaim {namespace}/{claim_name} not found")
        assert before is not None
        original = (before.get("spec", {}).get("lifecycle") or {}).get("shutdownTime")
        total_retries = 0
        written, retries = extend_claim(kube, namespace, claim_name, timedelta(minutes=5))
        total_retries += retries
        # `before` is stale now: its resourceVersion predates the write above, so this
        # round's first write must answer 409 and be retried on a fresh read.
        written, retries = extend_claim(kube, namespace, claim_name, timedelta(minutes=5),
                                        start_from=before)
        check(retries >= 1, "a write with a stale resourceVersion was not refused with 409")
        total_retries += retries
        for _ in range(3):  # back to back, while the controller reconciles each change
            written, retries = extend_claim(kube, namespace, claim_name, timedelta(minutes=5))
            total_retries += retries
        time.sleep(1.0)  # let the controller react to the last change
        after = kube.get_claim(namespace, claim_name)
        assert after is not None
        stored = (after.get("spec", {}).get("lifecycle") or {}).get("shutdownTime")
        check(stored is not None and parse_time(stored) == parse_time(written),
              f"shutdownTime is {stored}, not {written} as written")
        check(parse_time(stored) > parse_time(original) + timedelta(minutes=20),
              f"shutdownTime {stored} did not move 25 min past {original}")
        ready = [c for c in (after.get("status") or {}).get("conditions") or []
                 if c.get("type") == "Ready"]
        check(bool(ready) and ready[0].get("status") == "True",
              f"claim not Ready after the extension: {ready}")
        log(f"  shutdownTime {original} -> {stored} (5 read-modify-writes, "
            f"409 retries {total_retries})")

        # --- disconnect and reconnect -----------------------------------------------------
        sandbox.close_connection()
        check(not sandbox.is_active, "the handle is still active after close_connection()")
        if tunnel:
            check(first_tunnel.poll() is not None,
                  "close_connection() left the kubectl port-forward running")
        again = client.get_sandbox(claim_name, namespace=namespace, resolve_timeout=30)
        handles.append(again)
        install_auth(again, auth)
        check(again is not sandbox and again.sandbox_id == sandbox.sandbox_id,
              "get_sandbox() did not re-attach to the same sandbox")
        rerun = again.commands.run("echo hello again", timeout=HTTP_TIMEOUT)
        check(rerun.stdout == "hello again\n" and rerun.exit_code == 0, f"rerun: {rerun!r}")
        check(again.files.read("smoke/data.bin", timeout=HTTP_TIMEOUT) == binary,
              "smoke/data.bin differs after reconnecting")
        second_tunnel = tunnel_process(again) if tunnel else None
        if tunnel:
            check(second_tunnel is not None and second_tunnel.pid != first_tunnel.pid,
                  "the reconnected handle did not start its own port-forward")
        log("  disconnect/reconnect: same sandbox, command and file ok")
        if auth is not None:
            log(f"  auth hook: {auth.requests} requests, {auth.minted} scoped tokens minted")

        # --- delete -----------------------------------------------------------------------
        sandbox_id = again.sandbox_id
        again.terminate()
        if tunnel:
            check(second_tunnel.poll() is not None,
                  "terminate() left the kubectl port-forward running")
        waited = wait_until(f"SandboxClaim {namespace}/{claim_name} to be gone", 30,
                            lambda: kube.get_claim(namespace, claim_name) is None)
        log(f"  claim deleted, gone after {waited * 1000:.0f} ms")
        waited = wait_until(f"Sandbox {namespace}/{sandbox_id} to be gone", 60,
                            lambda: kube.get_sandbox(namespace, sandbox_id) is None)
        log(f"  sandbox {sandbox_id} gone after {waited * 1000:.0f} ms")
        claim_name = None
    finally:
        signal.alarm(0)  # cleanup runs on its own bounded calls
        for handle in handles:
            with contextlib.suppress(Exception):
                handle.close_connection()  # stops a tunnel's kubectl port-forward
        if claim_name is not None:
            try:
                kube.delete_claim(namespace, claim_name)
                log(f"  cleanup: deleted SandboxClaim {namespace}/{claim_name}")
            except Exception as error:  # noqa: BLE001 - report and go on
                log(f"  cleanup: could not delete SandboxClaim {namespace}/{claim_name}: {error}")


# ---------------------------------------------------------------------------------------------


def main() -> int:
    logging.basicConfig(
        level=logging.INFO if env("SANDBOX_SMOKE_VERBOSE") == "1" else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s")

    kubeconfig = env("KUBECONFIG")
    if not kubeconfig or not any(os.path.isfile(p) for p in kubeconfig.split(os.pathsep)):
        why = ("KUBECONFIG is not set" if not kubeconfig
               else f"KUBECONFIG={kubeconfig} names no file")
        if ci():
            log(f"FAIL: {why} (CI=true: a missing cluster is a failure)")
            return 1
        log(f"SKIP: {why}; point it at an admin kubeconfig (e.g. `sandboxctl dev "
            f"--kubeconfig-out F`, see README.md)")
        return 0

    modes = [m.strip() for m in (env("SANDBOX_MODES") or ",".join(DEFAULT_MODES)).split(",")
             if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        log(f"FAIL: unknown SANDBOX_MODES {unknown}; known: {', '.join(MODES)}")
        return 1

    key = None
    key_file = env("SANDBOX_ROUTER_SIGNING_KEY_FILE")
    token = env("SANDBOX_ROUTER_TOKEN")
    if token is None and key_file is not None:
        with open(key_file, "rb") as f:
            key = f.read().strip()
        if len(key) < 32:
            log(f"FAIL: the signing key in {key_file} is shorter than 32 bytes")
            return 1
    settings = {
        "namespace": env("SANDBOX_NAMESPACE", "default"),
        "pool": env("SANDBOX_WARM_POOL", "python-sandbox-pool"),
        "router_url": env("SANDBOX_ROUTER_URL"),
        "token": token,
        "key": key,
    }
    try:
        timeout = int(env("SANDBOX_SMOKE_TIMEOUT", "240"))
    except ValueError:
        log("FAIL: SANDBOX_SMOKE_TIMEOUT must be whole seconds")
        return 1

    import importlib.metadata

    auth_kind = "static token" if token else ("scoped tokens" if key else "none")
    log(f"k8s-agent-sandbox {importlib.metadata.version('k8s-agent-sandbox')}; modes "
        f"{','.join(modes)}; claim namespace {settings['namespace']}, pool {settings['pool']}; "
        f"router auth: {auth_kind}")

    def on_alarm(_signum: int, _frame: Any) -> None:
        raise ModeTimeout(f"the mode took longer than SANDBOX_SMOKE_TIMEOUT={timeout} s")

    signal.signal(signal.SIGALRM, on_alarm)
    kube = Kube()
    outcome: dict[str, str] = {}
    for mode in modes:
        log(f"== {mode}")
        signal.alarm(timeout)
        try:
            run_mode(mode, kube, settings)
            outcome[mode] = "PASS"
        except Skipped as why:
            outcome[mode] = "FAIL" if ci() else "SKIP"
            log(f"{outcome[mode]} ({mode}): skipped: {why}")
        except Exception as error:  # noqa: BLE001 - every failure is reported per mode
            outcome[mode] = "FAIL"
            traceback.print_exc()
            log(f"FAIL ({mode}): {type(error).__name__}: {error}")
        finally:
            signal.alarm(0)
    log("== summary: " + ", ".join(f"{m} {r}" for m, r in outcome.items()))
    return 0 if all(r in ("PASS", "SKIP") for r in outcome.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
