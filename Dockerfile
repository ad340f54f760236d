# syntax=docker/dockerfile:1
#
# One multi-stage build for the three images (`cargo xtask images` builds each target):
#
#   --target controller  agent-sandbox-controller on distroless (non-root, no shell)
#   --target router      sandbox-router on distroless (non-root, no shell)
#   --target runtime     python + sandbox-runtime, USER 1000, WORKDIR /app, port 8888
#   --target python-runtime-sandbox
#                        sandbox-runtime in the environment of upstream's python-runtime-sandbox
#                        image: Python 3.14, libgomp1, pandas, scikit-learn, lightgbm
#                        (crates/runtime/image/python-runtime-sandbox/README.md)
#
# The builder and the distroless and runtime bases are Debian 12 (bookworm), so the binaries'
# glibc matches; python-runtime-sandbox's base is Debian 13, whose newer glibc runs them too.
#
# Without Docker, `cargo xtask images --oci DIR` builds the controller, router and runtime images
# as OCI archives on pinned Debian 12 packages (runtime: Debian's Python 3.11), with the users,
# ports, environment, working directories and entrypoints below: xtask/src/images/spec.rs holds
# them, and a test fails when this file and it differ.

ARG RUST_VERSION=1.95.0

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target directory between builds (BuildKit).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
        -p agent-sandbox-controller -p agent-sandbox-router -p agent-sandbox-runtime \
    && mkdir -p /out \
    && cp target/release/agent-sandbox-controller target/release/sandbox-router \
          target/release/sandbox-runtime /out/

FROM gcr.io/distroless/cc-debian12:nonroot AS controller
COPY --from=build /out/agent-sandbox-controller /usr/local/bin/agent-sandbox-controller
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/agent-sandbox-controller"]

FROM gcr.io/distroless/cc-debian12:nonroot AS router
COPY --from=build /out/sandbox-router /usr/local/bin/sandbox-router
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/sandbox-router"]

FROM docker.io/library/python:3.13-slim-bookworm AS runtime
RUN groupadd --gid 1000 sandbox \
    && useradd --uid 1000 --gid 1000 --create-home --home-dir /home/sandbox --shell /bin/sh sandbox \
    && mkdir -p /app \
    && chown 1000:1000 /app
COPY --from=build /out/sandbox-runtime /usr/local/bin/sandbox-runtime
ENV SANDBOX_LISTEN=0.0.0.0:8888 \
    SANDBOX_BASE_DIR=/app \
    HOME=/home/sandbox
USER 1000:1000
WORKDIR /app
EXPOSE 8888
ENTRYPOINT ["/usr/local/bin/sandbox-runtime"]

FROM docker.io/library/python:3.14-slim AS python-runtime-sandbox
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*
COPY crates/runtime/image/python-runtime-sandbox/requirements.txt /tmp/requirements.txt
RUN pip install --no-cache-dir --require-hashes -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt \
    && groupadd --gid 1000 sandbox \
    && useradd --uid 1000 --gid 1000 --create-home --home-dir /home/sandbox --shell /bin/sh sandbox \
    && mkdir -p /app \
    && chown 1000:1000 /app
COPY --from=build /out/sandbox-runtime /usr/local/bin/sandbox-runtime
ENV SANDBOX_LISTEN=0.0.0.0:8888 \
    SANDBOX_BASE_DIR=/app \
    HOME=/home/sandbox
USER 1000:1000
WORKDIR /app
EXPOSE 8888
ENTRYPOINT ["/usr/local/bin/sandbox-runtime"]
