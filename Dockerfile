# Multi-stage build: a static redproxy binary in an image with nothing else,
# running as a non-root user.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/redproxy ./cmd/redproxy

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/redproxy /usr/local/bin/redproxy
COPY config.example.toml /etc/redproxy/config.example.toml
USER nonroot:nonroot
EXPOSE 6380 9121
# The proxy listens on loopback by default; in a container it must listen on
# all interfaces. The admin port stays loopback unless you publish it on
# purpose (it serves /policy/reload).
ENTRYPOINT ["/usr/local/bin/redproxy", "--listen", "0.0.0.0:6380"]
