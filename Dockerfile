# syntax=docker/dockerfile:1
# The bases are build arguments so that a site without a container registry can supply its own:
# scripts/image.sh builds both from a debootstrapped Debian root (docs/modes.md). The defaults are
# the official images.
ARG GO_IMAGE=golang:1.26-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${GO_IMAGE} AS build
# The official image has Go here already; a plain Debian base gets it mounted at build time.
ENV PATH=/usr/local/go/bin:$PATH GOMODCACHE=/go/pkg/mod CGO_ENABLED=0 GOTOOLCHAIN=local
# GOPROXY and GOFLAGS may be passed (GOPROXY=off with a module cache mounted, when offline).
ARG GOPROXY
ARG GOFLAGS
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/proxy ./cmd/proxy

# The runtime holds what the local sandbox needs: bubblewrap and Python with numpy, pandas,
# matplotlib, and pip for the installs a container's network policy allows. python3-munkres is
# there to meet fonttools' "scipy | munkres" with the small one: scipy would bring pythran, a
# compiler and Python's headers (about 500 MB). How to run it with the local sandbox at full
# strength, and what each way of running guarantees: docs/modes.md.
FROM ${RUNTIME_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap python3 python3-pip python3-numpy python3-pandas \
    python3-matplotlib python3-munkres ca-certificates curl \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/* \
 && useradd --uid 10001 --user-group --no-create-home --home-dir /var/lib/ciproxy ciproxy \
 && install -d -o 10001 -g 10001 /var/lib/ciproxy
COPY --from=build /out/proxy /usr/local/bin/proxy
COPY config.example.yaml /etc/ciproxy/config.yaml
# Numeric, so that a Kubernetes pod with runAsNonRoot can verify it is not root.
USER 10001:10001
# The embedded store (stored responses, container records, Files API files) lives here: mount a
# volume to keep it across container restarts, or configure Redis (router_settings.redis_*).
VOLUME /var/lib/ciproxy
EXPOSE 4000
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s CMD curl -fsS http://127.0.0.1:4000/healthz || exit 1
ENTRYPOINT ["/usr/local/bin/proxy"]
CMD ["--config", "/etc/ciproxy/config.yaml", "--data-dir", "/var/lib/ciproxy"]
