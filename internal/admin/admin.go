// Package admin serves the proxy's HTTP endpoints: Prometheus metrics,
// liveness and readiness, and the feature endpoints registered by other
// packages. It listens on its own address, loopback by default, because
// some endpoints (reload, reports) are operator tools.
package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
)

// Server is the admin HTTP server.
type Server struct {
	mux   *http.ServeMux
	http  *http.Server
	log   *slog.Logger
	token atomic.Pointer[[]byte] // bearer token; nil: open

	mu        sync.Mutex
	endpoints []string            // patterns registered, for the index at /
	methods   map[string][]string // path -> methods registered by Handle
}

// New builds the admin server. ready reports whether Redis is reachable.
func New(reg *prometheus.Registry, ready func() bool, log *slog.Logger) *Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			// Redis unreachable or busy (a long script), no primary known,
			// or the proxy draining: proxy.Server.Ready.
			http.Error(w, "not ready: Redis unreachable or busy, or the proxy is shutting down", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	// Profiles are how a CPU-per-request regression is explained; the admin
	// address is loopback by default, and elsewhere needs the token.
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	s := &Server{mux: mux, log: log,
		endpoints: []string{"GET /metrics", "GET /healthz", "GET /readyz", "GET /debug/pprof/"}}
	// A bare 404 at / left a user guessing the endpoints (found by a
	// user's trial).
	mux.HandleFunc("GET /{$}", s.index)
	// An idle keep-alive connection had no deadline at all, and neither
	// had headers' size beyond net/http's 1 MB: a peer that sent one
	// request (even a refused one) could hold a connection, and a file
	// descriptor the Redis listener also draws on, forever (found by
	// review).
	// ReadTimeout bounds the body too: a request that declared a body and
	// never sent it stayed in its request for good, beyond the reach of
	// the connection cap's eviction (review). Writes are bounded per
	// request (serveHTTP).
	s.http = &http.Server{Handler: http.HandlerFunc(s.serveHTTP), ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout: readTimeout, IdleTimeout: idleTimeout, MaxHeaderBytes: 64 << 10}
	return s
}

// readTimeout bounds reading a request, body included, and writeTimeout
// writing a reply but a profile's or trace's, which last the seconds asked
// for; variables for tests.
var (
	readTimeout  = 10 * time.Second
	writeTimeout = 30 * time.Second
)

// writeDeadline is when the reply to r must be written: a client that
// stopped reading a reply (/metrics, a goroutine dump) held its
// connection, and a slot of the cap, for good (review). A CPU profile or
// trace runs the seconds asked for (30 and 1 by default) first.
func writeDeadline(r *http.Request) time.Time {
	d := writeTimeout
	switch r.URL.Path {
	case "/debug/pprof/profile", "/debug/pprof/trace":
		secs, err := strconv.ParseInt(r.URL.Query().Get("seconds"), 10, 64)
		if err != nil || secs <= 0 {
			secs = 30
		}
		d += time.Duration(min(secs, 3600)) * time.Second
	}
	return time.Now().Add(d)
}

// idleTimeout closes a keep-alive connection idle this long; a variable
// for tests.
var idleTimeout = time.Minute

// SetToken makes every endpoint but /healthz and /readyz require
// "Authorization: Bearer <token>". Profiles and /debug/hotkeys (key names
// are data) are included. An empty token leaves the endpoint open.
func (s *Server) SetToken(token string) {
	if token == "" {
		s.token.Store(nil)
		return
	}
	b := []byte(token)
	s.token.Store(&b)
}

// Handler is the server's handler, token check included, for tests.
func (s *Server) Handler() http.Handler { return s.http.Handler }

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	http.NewResponseController(w).SetWriteDeadline(writeDeadline(r))
	health := r.URL.Path == "/healthz" || r.URL.Path == "/readyz"
	if tok := s.token.Load(); tok == nil && !health {
		if msg := browserRefusal(r); msg != "" {
			http.Error(w, "forbidden: "+msg, http.StatusForbidden)
			return
		}
	}
	if tok := s.token.Load(); tok != nil && !health {
		scheme, got := bearerToken(r.Header.Get("Authorization"))
		// The scheme is case-insensitive (RFC 9110); "bearer" was refused.
		if !strings.EqualFold(scheme, "Bearer") || !auth.SecretEqual([]byte(got), *tok) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="redproxy admin"`)
			http.Error(w, "unauthorized: this endpoint needs the admin token (Authorization: Bearer <admin.token_file>)", http.StatusUnauthorized)
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

// bearerToken splits an Authorization header into its scheme and
// credentials. RFC 9110 separates them by one or more spaces; a token
// after two spaces, or a tab, was refused (found by a probe).
func bearerToken(h string) (scheme, token string) {
	i := strings.IndexAny(h, " \t")
	if i < 0 {
		return h, ""
	}
	return h[:i], strings.TrimLeft(h[i:], " \t")
}

// browserRefusal says why a request to the endpoint without a token (it is
// then on a loopback address, Token) is refused, "" when it is not. A web
// page can make a browser send requests to a loopback address: by DNS
// rebinding (a name of the page's that resolves to 127.0.0.1, whose
// requests then carry that name as Host), which reads /metrics,
// /debug/hotkeys (key names are data) or profiles; or by a cross-site form
// POST, which needs no answer to reload the policy or the configuration
// (noted by the security review). So the Host must be a loopback address
// or "localhost", and a request that changes something must not come from
// another site.
func browserRefusal(r *http.Request) string {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if !loopbackName(host) {
		return fmt.Sprintf("Host %q is not a loopback address; the admin endpoint without admin.token_file answers only requests addressed to localhost or a loopback IP (a guard against DNS rebinding)", r.Host)
	}
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return ""
	}
	if r.Header.Get("Sec-Fetch-Site") == "cross-site" {
		return "a cross-site request may not change anything"
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || !loopbackName(u.Hostname()) {
			return fmt.Sprintf("Origin %q is another site, which may not change anything", o)
		}
	}
	return ""
}

// loopbackName is config.LoopbackHost for a Host header's host, where an
// IPv6 address without a port keeps its brackets.
func loopbackName(host string) bool {
	return config.LoopbackHost(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
}

// ErrTokenRequired is returned by Token when the admin endpoint is bound
// to an address other hosts can reach and no token file is configured.
var ErrTokenRequired = errors.New("the admin endpoint is not on a loopback address: set admin.token_file (--admin-token-file, REDPROXY_ADMIN_TOKEN_FILE)")

// Token returns the bearer token the admin endpoint at addr needs: the
// content of tokenFile (trailing newlines dropped), "" for none. An
// address that is not loopback requires a token.
func Token(addr, tokenFile string, loopback bool) (string, error) {
	if tokenFile == "" {
		if !loopback {
			return "", fmt.Errorf("%w (server.admin is %q)", ErrTokenRequired, addr)
		}
		return "", nil
	}
	b, err := os.ReadFile(tokenFile)
	if err != nil {
		return "", fmt.Errorf("admin.token_file: %w", err)
	}
	// Surrounding whitespace is never part of a token: an editor's
	// trailing space made every request 401, where Prometheus's
	// credentials_file, reading the same file, strips it (found by review).
	tok := strings.TrimSpace(string(b))
	if len(tok) < 16 {
		return "", fmt.Errorf("admin.token_file %s: the token is shorter than 16 characters", tokenFile)
	}
	return tok, nil
}

// Handle registers another endpoint (pattern as for http.ServeMux).
func (s *Server) Handle(pattern string, h http.Handler) {
	s.mu.Lock()
	s.endpoints = append(s.endpoints, pattern)
	method, path, hasMethod := strings.Cut(pattern, " ")
	first := false
	if hasMethod {
		if s.methods == nil {
			s.methods = map[string][]string{}
		}
		first = s.methods[path] == nil
		s.methods[path] = append(s.methods[path], method)
	}
	s.mu.Unlock()
	s.mux.Handle(pattern, h)
	if first {
		// net/http's own 405 says "Method Not Allowed" and no more: a
		// user's GET /reload did not learn it wants POST.
		s.mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) { s.wrongMethod(w, r, path) })
	}
}

// wrongMethod answers a request for path with a method none of its
// endpoints takes, naming the ones it does.
func (s *Server) wrongMethod(w http.ResponseWriter, r *http.Request, path string) {
	s.mu.Lock()
	allowed := slices.Clone(s.methods[path])
	s.mu.Unlock()
	if slices.Contains(allowed, http.MethodGet) && !slices.Contains(allowed, http.MethodHead) {
		allowed = append(allowed, http.MethodHead)
	}
	w.Header().Set("Allow", strings.Join(allowed, ", "))
	http.Error(w, fmt.Sprintf("%s %s: method not allowed; use %s (e.g. curl -X %s)", r.Method, path,
		strings.Join(allowed, " or "), allowed[0]), http.StatusMethodNotAllowed)
}

// index lists the endpoints.
func (s *Server) index(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	eps := slices.Clone(s.endpoints)
	s.mu.Unlock()
	slices.Sort(eps)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "redproxy admin endpoints:\n")
	for _, e := range eps {
		fmt.Fprintf(w, "  %s\n", e)
	}
}

// maxConns caps the admin endpoint's open connections; a variable for
// tests. Its file descriptors come out of the few the proxy keeps beside
// one per client (proxy.fdReserve, 128): with no cap, a peer opening
// connections without end took descriptors the Redis listener and the
// upstream pools need (found by a probe). Scrapers, health checks and an
// operator's profile need a handful.
var maxConns = 64

// busyResponse is what a connection past maxConns is told before it is
// closed, so a scraper logs why rather than a reset.
const busyResponse = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: 62\r\n\r\ntoo many connections to the admin endpoint; try again shortly\n"

// Serve serves on ln until Shutdown, at most maxConns connections at once.
func (s *Server) Serve(ln net.Listener) error {
	l := &connLimitListener{Listener: ln, slots: make(chan struct{}, maxConns),
		waiting: map[*limitedConn]time.Time{}, refusing: make(chan struct{}, 8)}
	s.http.ConnState = l.connState // one Serve per Server (main's admin listener)
	err := s.http.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops the server, waiting for requests in flight up to ctx.
func (s *Server) Shutdown(ctx context.Context) error { return s.http.Shutdown(ctx) }

// Close stops the server at once: its listener and every connection,
// requests in flight (a CPU profile, a trace) included, are closed.
func (s *Server) Close() error { return s.http.Close() }

// connLimitListener accepts at most cap(slots) connections open at once.
// When all are taken, a new connection makes room by closing the one that
// has waited longest with no request in progress (an idle keep-alive, or
// one that has sent nothing yet): a full set of idle connections, which a
// peer can keep up by opening them again, must not turn the health checks
// away and have an orchestrator restart the proxy (found by review). Only
// when every connection stays in a request (take) is the new one answered 503 and
// closed, rather than left in the backlog, where it would hold the peer (a
// Prometheus scrape) until its own timeout with no word of why.
type connLimitListener struct {
	net.Listener
	slots chan struct{}

	mu      sync.Mutex
	waiting map[*limitedConn]time.Time // no request in progress, since when
	// refusing bounds the goroutines answering 503.
	refusing chan struct{}
}

func (l *connLimitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.take() {
			return &limitedConn{Conn: c, slots: l.slots}, nil
		}
		select {
		case l.refusing <- struct{}{}:
			go l.refuse(c)
		default:
			c.Close()
		}
	}
}

// take takes a slot, closing the longest-waiting connection with no
// request in progress if none is free; false when every connection is in
// a request for takeWait. net/http marks a connection idle a moment after
// its response is written, so its client may already be opening the next
// connection, which was refused 503 when that request was the cap's last
// (found by CI: a health check answered, then the connections that fill
// the cap, and the last of them was refused one time in a few hundred).
func (l *connLimitListener) take() bool {
	deadline := time.Now().Add(takeWait)
	for {
		if l.takeNow() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(takeWait / 20)
	}
}

// takeWait bounds how long a new connection waits for a request to end
// when every connection is in one.
const takeWait = 100 * time.Millisecond

// takeNow is take without waiting.
func (l *connLimitListener) takeNow() bool {
	select {
	case l.slots <- struct{}{}:
		return true
	default:
	}
	l.mu.Lock()
	var oldest *limitedConn
	var since time.Time
	for c, t := range l.waiting {
		if (oldest == nil || t.Before(since)) && !c.requestStarted() {
			oldest, since = c, t
		}
	}
	if oldest != nil {
		delete(l.waiting, oldest)
		// Under l.mu, so net/http cannot mark it in a request in between
		// (connState waits); gives its slot back, and net/http's own
		// close of it is a no-op.
		oldest.Close()
	}
	l.mu.Unlock()
	if oldest == nil {
		return false
	}
	select {
	case l.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

// refuse answers 503 and closes c. It reads the request first: written
// before it, the 503 could reach a Go client (Prometheus) in the moment
// between its dial and its request, which it reports as a broken
// connection rather than the 503 (found by review).
func (l *connLimitListener) refuse(c net.Conn) {
	defer func() { <-l.refusing }()
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(time.Second))
	var head [4096]byte
	n := 0
	for n < len(head) && !strings.Contains(string(head[:n]), "\r\n\r\n") {
		k, err := c.Read(head[n:])
		n += k
		if err != nil {
			break
		}
	}
	c.SetWriteDeadline(time.Now().Add(time.Second))
	io.WriteString(c, busyResponse)
}

// connState keeps l.waiting: the connections with no request in progress.
func (l *connLimitListener) connState(nc net.Conn, st http.ConnState) {
	c, ok := nc.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch st {
	case http.StateNew, http.StateIdle:
		// Before net/http reads the request: it runs this hook first.
		c.read.Store(false)
		l.waiting[c] = time.Now()
	default:
		delete(l.waiting, c)
	}
}

// limitedConn gives its slot back once, however often it is closed
// (net/http may close a connection twice).
type limitedConn struct {
	net.Conn
	slots    chan struct{}
	released atomic.Bool
	// read: bytes came in since net/http last marked the connection new
	// or idle (connState). net/http marks it active only once a request's
	// whole head is read.
	read atomic.Bool
}

func (c *limitedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.read.Store(true)
	}
	return n, err
}

// requestStarted reports whether part of a request has reached c, read
// or still in its socket, though net/http has not marked it active: such
// a connection is a client's request on its way (a health check whose
// request is in but not yet read, or read only in part), not one left
// idle, and is never closed to make room. Closed, health checks failed
// with empty replies and resets while a peer kept re-opening idle
// connections (found by a probe: 5 in 50, at 4,000 re-opens a second).
func (c *limitedConn) requestStarted() bool {
	if c.read.Load() {
		return true
	}
	n, ok := unread(c.Conn)
	return ok && n > 0
}

func (c *limitedConn) Close() error {
	if c.released.CompareAndSwap(false, true) {
		<-c.slots
	}
	return c.Conn.Close()
}

// CloseWrite half-closes the connection, which net/http does before
// closing one whose request body it did not read, so the client reads the
// reply instead of a reset; the wrapper hid it (found by review).
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
