# redproxy in a container: a static binary on a distroless base (no shell,
# no package manager), running as a non-root user.
#
#   docker build -t redproxy .
#   docker run -e REDPROXY_UPSTREAM=redis:6379 -e REDPROXY_CONFIG=/etc/redproxy/redproxy.toml \
#     -v /etc/redproxy:/etc/redproxy:ro -p 6380:6380 redproxy
#
# The image listens on every interface, so it refuses to start open to
# anyone: the mounted file must give [[users]] or upstream.password (or set
# REDPROXY_ALLOW_UNAUTHENTICATED=true where the network is the boundary),
# and admin.token_file (REDPROXY_ADMIN_TOKEN_FILE) for the admin port.
# README "Docker" has the details.
#
# Configuration comes from the environment (or the same flags after the
# image name): REDPROXY_UPSTREAM (host:port, or "embedded" for the demo
# store; not with a file in Sentinel or cluster mode), REDPROXY_CONFIG (a TOML file, e.g. mounted at
# /etc/redproxy/redproxy.toml), and REDPROXY_<FLAG> for every other flag. A
# flag wins over its variable, and both win over the file.
# The go.mod toolchain exactly: official images set GOTOOLCHAIN=local, so
# an older cached 1.26.x image would refuse the module.
FROM golang:1.26.8 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=""
RUN CGO_ENABLED=0 go build -trimpath \
    -ldflags="-s -w -X github.com/redproxy/redproxy/internal/proxy.Version=${VERSION}" \
    -o /out/redproxy ./cmd/redproxy

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/redproxy /usr/local/bin/redproxy
COPY config.example.toml /etc/redproxy/config.example.toml
# Inside a container 127.0.0.1 is the container itself: listen on every
# interface, so clients and the orchestrator's probes reach both ports.
# These override server.listen and server.admin of a config file; set them
# to change the ports. The admin port serves /policy/reload and profiles:
# publish it only to the network your operators and Prometheus use.
ENV REDPROXY_LISTEN=0.0.0.0:6380 \
    REDPROXY_ADMIN=0.0.0.0:9121 \
    REDPROXY_REQUIRE_UPSTREAM=1
# REDPROXY_REQUIRE_UPSTREAM: with no REDPROXY_UPSTREAM and no config file the
# proxy exits with a message instead of silently running on the embedded
# demo store. REDPROXY_UPSTREAM=embedded still asks for it explicitly.
EXPOSE 6380 9121
USER nonroot:nonroot
# Liveness of the proxy itself, not of Redis: a Redis outage should make the
# proxy unready (/readyz, "redproxy healthcheck --ready"), not get it
# restarted.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/redproxy", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/redproxy"]
