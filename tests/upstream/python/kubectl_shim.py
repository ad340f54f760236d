#!/usr/bin/env python3
"""A stand-in for the two `kubectl` calls upstream's Python SDK makes in its tunnel mode, for
clusters where `kubectl port-forward` to the router Service cannot work (the simulated cluster
of `sandboxctl dev` serves neither the Service nor kubectl's port-forward protocols).

    kubectl get svc/sandbox-router-svc -n NS [...]          -> succeeds
    kubectl port-forward svc/sandbox-router-svc L:8080 ...  -> relays 127.0.0.1:L to the
                                                               router at $SHIM_ROUTER_URL

Anything else fails. Only smoke.py's `tunnel-shim` mode puts it on PATH: it tests the SDK's
tunnel lifecycle (pre-flight, local port, kubectl process per handle, teardown on
close_connection, a new process on reconnect), not kubectl or the API server.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import urllib.parse


def relay(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for sock, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass


def port_forward(local_port: int, target: tuple[str, int]) -> int:
    server = socket.create_server(("127.0.0.1", local_port))
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    print(f"Forwarding from 127.0.0.1:{local_port} -> {target[0]}:{target[1]} (shim)", flush=True)
    while True:
        client, _ = server.accept()
        try:
            upstream = socket.create_connection(target, timeout=10)
            upstream.settimeout(None)
        except OSError as error:
            print(f"shim: cannot reach the router at {target}: {error}", file=sys.stderr)
            client.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=relay, args=(a, b), daemon=True).start()


def main(argv: list[str]) -> int:
    url = urllib.parse.urlsplit(os.environ.get("SHIM_ROUTER_URL", ""))
    if url.scheme != "http" or not url.hostname:
        print("kubectl shim: SHIM_ROUTER_URL must be an http:// router URL", file=sys.stderr)
        return 1
    target = (url.hostname, url.port or 80)
    if argv[:2] == ["get", "svc/sandbox-router-svc"]:
        print("NAME                 TYPE        PORT(S)\nsandbox-router-svc   ClusterIP   8080/TCP")
        return 0
    if argv[:2] == ["port-forward", "svc/sandbox-router-svc"] and len(argv) > 2:
        local, _, remote = argv[2].partition(":")
        if remote != "8080":
            print(f"kubectl shim: unexpected remote port {remote!r}", file=sys.stderr)
            return 1
        return port_forward(int(local), target)
    print(f"kubectl shim: unsupported call: kubectl {' '.join(argv)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
