# syntax=docker/dockerfile:1
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/proxy ./cmd/proxy

# The runtime holds what the local sandbox needs: bubblewrap and Python with numpy, pandas, matplotlib.
# bubblewrap needs user namespaces: run with --security-opt seccomp=unconfined --security-opt
# apparmor=unconfined (or a profile that allows unshare), or configure an e2b sandbox tool instead.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap python3 python3-numpy python3-pandas \
    python3-matplotlib ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --create-home ciproxy \
 && install -d -o ciproxy -g ciproxy /var/lib/ciproxy
COPY --from=build /out/proxy /usr/local/bin/proxy
COPY config.example.yaml /etc/ciproxy/config.yaml
USER ciproxy
# The embedded store (stored responses, container records, Files API files) lives here: mount a
# volume to keep it across container restarts, or configure Redis (router_settings.redis_*).
VOLUME /var/lib/ciproxy
EXPOSE 4000
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s CMD curl -fsS http://127.0.0.1:4000/healthz || exit 1
ENTRYPOINT ["/usr/local/bin/proxy"]
CMD ["--config", "/etc/ciproxy/config.yaml", "--data-dir", "/var/lib/ciproxy"]
