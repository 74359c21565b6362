package admin

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/redproxy/redproxy/internal/redistest"
)

func get(t *testing.T, h http.Handler, path, token string) int {
	t.Helper()
	r := httptest.NewRequest("GET", path, nil)
	r.Host = "127.0.0.1:9121"
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code
}

func newTestServer() *Server {
	s := New(prometheus.NewRegistry(), func() bool { return true }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	s.Handle("GET /debug/hotkeys", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("keys")) }))
	s.Handle("GET /policy/report", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("{}")) }))
	return s
}

// With a token, everything but the health checks needs it, profiles and
// hot keys included.
func TestAdminTokenRequired(t *testing.T) {
	s := newTestServer()
	s.SetToken("0123456789abcdef-token")
	h := s.Handler()
	for _, p := range []string{"/healthz", "/readyz"} {
		if c := get(t, h, p, ""); c != 200 {
			t.Errorf("%s without token: %d", p, c)
		}
	}
	for _, p := range []string{"/metrics", "/debug/pprof/", "/debug/pprof/cmdline", "/debug/hotkeys", "/policy/report"} {
		if c := get(t, h, p, ""); c != http.StatusUnauthorized {
			t.Errorf("%s without token: %d, want 401", p, c)
		}
		if c := get(t, h, p, "wrong-token-wrong-token"); c != http.StatusUnauthorized {
			t.Errorf("%s with a wrong token: %d, want 401", p, c)
		}
		if c := get(t, h, p, "0123456789abcdef-token"); c != 200 {
			t.Errorf("%s with the token: %d", p, c)
		}
	}
}

// Without a token (loopback), the endpoint stays open.
func TestAdminOpenOnLoopbackWithoutToken(t *testing.T) {
	h := newTestServer().Handler()
	for _, p := range []string{"/metrics", "/debug/hotkeys", "/debug/pprof/"} {
		if c := get(t, h, p, ""); c != 200 {
			t.Errorf("%s: %d", p, c)
		}
	}
}

func TestAdminToken(t *testing.T) {
	if _, err := Token("0.0.0.0:9121", "", false); !errors.Is(err, ErrTokenRequired) {
		t.Errorf("non-loopback without a token file: %v", err)
	}
	if tok, err := Token("127.0.0.1:9121", "", true); err != nil || tok != "" {
		t.Errorf("loopback without a token file: %q %v", tok, err)
	}
	f := filepath.Join(t.TempDir(), "token")
	os.WriteFile(f, []byte("0123456789abcdef-token\n"), 0o600)
	if tok, err := Token("0.0.0.0:9121", f, false); err != nil || tok != "0123456789abcdef-token" {
		t.Errorf("token file: %q %v", tok, err)
	}
	os.WriteFile(f, []byte(" 0123456789abcdef-token \t\r\n"), 0o600)
	if tok, err := Token("0.0.0.0:9121", f, false); err != nil || tok != "0123456789abcdef-token" {
		t.Errorf("token file with surrounding whitespace: %q %v", tok, err)
	}
	os.WriteFile(f, []byte("short\n"), 0o600)
	if _, err := Token("0.0.0.0:9121", f, false); err == nil {
		t.Error("a short token was accepted")
	}
}

// A keep-alive connection idle past idleTimeout is closed; the token's
// scheme is case-insensitive. (Found by review: idle connections were
// held forever, and "bearer <token>" was refused.)
func TestAdminIdleConnectionsCloseAndBearerCase(t *testing.T) {
	defer func(d time.Duration) { idleTimeout = d }(idleTimeout)
	idleTimeout = 200 * time.Millisecond
	s := newTestServer()
	s.SetToken("0123456789abcdef-token")
	addr := serveTest(t, s)
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	br := bufio.NewReader(nc)
	fmt.Fprint(nc, "GET /policy/report HTTP/1.1\r\nHost: x\r\nAuthorization: bearer 0123456789abcdef-token\r\n\r\n")
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("lower-case bearer: %d", res.StatusCode)
	}
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("an idle keep-alive connection: %v, want it closed (EOF) after the idle timeout", err)
	}
}

// The token may follow the scheme after any number of spaces (RFC 9110's
// 1*SP) or a tab; a wrong or missing token is still refused.
func TestAdminBearerSeparators(t *testing.T) {
	const token = "0123456789abcdef-token"
	s := newTestServer()
	s.SetToken(token)
	h := s.Handler()
	for _, c := range []struct {
		header string
		want   int
	}{
		{"Bearer " + token, http.StatusOK},
		{"Bearer  " + token, http.StatusOK},
		{"Bearer\t" + token, http.StatusOK},
		{"BEARER \t " + token, http.StatusOK},
		{"Bearer", http.StatusUnauthorized},
		{"Bearer ", http.StatusUnauthorized},
		{"Bearer  x" + token, http.StatusUnauthorized},
		{"Basic " + token, http.StatusUnauthorized},
		{token, http.StatusUnauthorized},
	} {
		r := httptest.NewRequest("GET", "/policy/report", nil)
		r.Header.Set("Authorization", c.header)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("Authorization %q: %d, want %d", c.header, w.Code, c.want)
		}
	}
}

// Without a token (a loopback address), a request a web page could make a
// browser send is refused: by DNS rebinding (a Host that is not loopback)
// or, for what changes something, from another site.
func TestAdminWithoutTokenRefusesBrowserRequests(t *testing.T) {
	s := newTestServer()
	s.Handle("POST /policy/reload", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("reloaded")) }))
	h := s.Handler()
	for _, c := range []struct {
		method, host, origin, site string
		want                       int
	}{
		{"GET", "127.0.0.1:9121", "", "", 200},
		{"GET", "localhost:9121", "", "", 200},
		{"GET", "LOCALHOST", "", "", 200},
		{"GET", "[::1]:9121", "", "", 200},
		{"GET", "attacker.example:9121", "", "", http.StatusForbidden},
		{"GET", "10.0.0.5:9121", "", "", http.StatusForbidden},
		{"POST", "127.0.0.1:9121", "", "", 200},
		{"POST", "127.0.0.1:9121", "http://localhost:3000", "same-site", 200},
		{"POST", "127.0.0.1:9121", "https://attacker.example", "", http.StatusForbidden},
		{"POST", "127.0.0.1:9121", "", "cross-site", http.StatusForbidden},
		{"POST", "127.0.0.1:9121", "null", "", http.StatusForbidden},
	} {
		path := "/metrics"
		if c.method == "POST" {
			path = "/policy/reload"
		}
		r := httptest.NewRequest(c.method, path, nil)
		r.Host = c.host
		if c.origin != "" {
			r.Header.Set("Origin", c.origin)
		}
		if c.site != "" {
			r.Header.Set("Sec-Fetch-Site", c.site)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("%s %s Host %s Origin %q Sec-Fetch-Site %q: %d, want %d (%s)", c.method, path, c.host, c.origin, c.site, w.Code, c.want, w.Body)
		}
	}
	// Health checks stay open to any Host (probes address the pod's IP).
	r := httptest.NewRequest("GET", "/healthz", nil)
	r.Host = "10.0.0.5:9121"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 200 {
		t.Errorf("/healthz with a Host that is not loopback: %d", w.Code)
	}
}

// GET / lists the endpoints, the ones registered later included; other
// unknown paths stay 404.
func TestAdminIndexListsEndpoints(t *testing.T) {
	s := newTestServer()
	r := httptest.NewRequest("GET", "/", nil)
	r.Host = "127.0.0.1:9121"
	w := httptest.NewRecorder()
	s.http.Handler.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("GET /: %d", w.Code)
	}
	for _, want := range []string{"GET /metrics", "GET /readyz", "GET /policy/report", "GET /debug/hotkeys"} {
		if !strings.Contains(w.Body.String(), want) {
			t.Errorf("GET / does not list %q:\n%s", want, w.Body.String())
		}
	}
	if code := get(t, s.http.Handler, "/nothing", ""); code != http.StatusNotFound {
		t.Errorf("GET /nothing: %d, want 404", code)
	}
}

// A method an endpoint does not take is answered 405 with the methods it
// does take, in the body and in Allow; the endpoint itself still answers.
func TestAdminWrongMethodNamesTheRightOne(t *testing.T) {
	s := newTestServer()
	s.Handle("POST /reload", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("reloaded")) }))
	s.Handle("GET /debug/slowlog", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("log")) }))
	s.Handle("DELETE /debug/slowlog", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("emptied")) }))
	do := func(method, path string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, nil)
		r.Host = "127.0.0.1:9121"
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, r)
		return w
	}
	for _, c := range []struct{ method, path, allow, body string }{
		{"GET", "/reload", "POST", "GET /reload: method not allowed; use POST (e.g. curl -X POST)"},
		{"PUT", "/debug/slowlog", "GET, DELETE, HEAD", "use GET or DELETE or HEAD"},
		{"POST", "/debug/hotkeys", "GET, HEAD", "use GET or HEAD"},
	} {
		w := do(c.method, c.path)
		if w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != c.allow || !strings.Contains(w.Body.String(), c.body) {
			t.Errorf("%s %s: %d, Allow %q, %q; want 405, Allow %q and %q", c.method, c.path, w.Code, w.Header().Get("Allow"), w.Body.String(), c.allow, c.body)
		}
	}
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/reload", "reloaded"}, {"GET", "/debug/slowlog", "log"}, {"DELETE", "/debug/slowlog", "emptied"}, {"GET", "/debug/hotkeys", "keys"},
	} {
		if w := do(c.method, c.path); w.Code != 200 || w.Body.String() != c.body {
			t.Errorf("%s %s: %d %q; want 200 %q", c.method, c.path, w.Code, w.Body.String(), c.body)
		}
	}
	if w := do("GET", "/"); strings.Contains(w.Body.String(), "  /reload") {
		t.Errorf("the index lists the wrong-method answer:\n%s", w.Body.String())
	}
}

// Past maxConns open connections, a new one takes the place of the one
// that has waited longest with no request in progress; only when every
// connection is in a request is it told 503 and closed, after its request
// is read. A slot given back serves again. (Found by a probe: connections
// were unbounded, and their descriptors come out of those the Redis
// listener and upstream pools need; by review: idle connections held up to
// the cap turned the health checks away.)
func TestAdminCapsOpenConnections(t *testing.T) {
	defer func(n int) { maxConns = n }(maxConns)
	maxConns = 3
	s := newTestServer()
	release := make(chan struct{})
	entered := make(chan struct{}, 8)
	s.Handle("GET /block", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		entered <- struct{}{}
		<-release
		w.Write([]byte("done"))
	}))
	addr := serveTest(t, s)
	dial := func() net.Conn { return dialTest(t, addr) }
	get := func(nc net.Conn, path string) (*http.Response, string, error) {
		fmt.Fprintf(nc, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path)
		nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		res, err := http.ReadResponse(bufio.NewReader(nc), nil)
		if err != nil {
			return nil, "", err
		}
		body, _ := io.ReadAll(res.Body)
		return res, string(body), nil
	}

	// Connections that send nothing fill the cap; a health check still
	// gets through, closing the oldest of them.
	var idle []net.Conn
	for range maxConns {
		idle = append(idle, dial())
	}
	if res, _, err := get(dial(), "/healthz"); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("a health check with the cap held by idle connections: %v %v", res, err)
	}
	idle[0].SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := idle[0].Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("the oldest idle connection: %v, want it closed", err)
	}

	// Every connection in a request: the next is told 503.
	var busy []net.Conn
	for range maxConns {
		nc := dial()
		fmt.Fprint(nc, "GET /block HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
		busy = append(busy, nc)
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			// Refused (503) rather than served: the cap counted a
			// connection as busy that was not.
			t.Fatalf("request %d of %d filling the cap never reached its handler", len(busy), maxConns)
		}
	}
	res, body, err := get(dial(), "/healthz")
	if err != nil || res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "too many connections") {
		t.Fatalf("a connection past the cap with every slot in a request: %v %q %v, want a 503", res, body, err)
	}
	close(release)
	for i, nc := range busy {
		nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		res, err := http.ReadResponse(bufio.NewReader(nc), nil)
		if err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("blocked request %d: %v %v", i, res, err)
		}
		nc.Close()
	}
	redistest.Eventually(t, 5*time.Second, func() bool {
		res, _, err := get(dial(), "/healthz")
		return err == nil && res.StatusCode == http.StatusOK
	}, "freed slots were not given to new connections")
}

// A request that declares a body and never sends it is cut by the read
// timeout: it stayed in its request for good, beyond the connection cap's
// eviction, so 64 of them turned every health check away (found by
// review).
func TestAdminRequestWithAMissingBodyIsCut(t *testing.T) {
	defer func(d time.Duration) { readTimeout = d }(readTimeout)
	readTimeout = 200 * time.Millisecond
	s := newTestServer()
	addr := serveTest(t, s)
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fmt.Fprint(nc, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n")
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(nc); err != nil {
		t.Fatalf("a request whose body never came: %v, want its connection closed", err)
	}
}

// A connection whose request has begun to arrive is not closed to make
// room, whether net/http has read part of it (it marks a connection in a
// request only once the whole head is in) or none yet: a peer re-opening
// idle connections as fast as they were closed made health checks fail
// with empty replies and resets (found by a probe: 5 in 50).
func TestAdminKeepsARequestOnItsWay(t *testing.T) {
	defer func(n int) { maxConns = n }(maxConns)
	maxConns = 2
	addr := serveTest(t, newTestServer())
	dial := func() net.Conn { return dialTest(t, addr) }
	idle := dial()
	check := dial()
	// Part of the head: net/http reads it and waits for the rest, the
	// connection still "new" to it. Then connections that send nothing
	// keep arriving, each closing the longest-waiting one it may.
	fmt.Fprint(check, "GET /healthz HTTP/1.1\r\nHo")
	closed := func(nc net.Conn) error {
		nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := nc.Read(make([]byte, 1))
		return err
	}
	// The idle connection is closed for the first newcomer; the check is
	// then older than the newcomer, so the next newcomer would close it.
	first := dial()
	if err := closed(idle); err != io.EOF {
		t.Fatalf("the idle connection: %v, want it closed for a newcomer", err)
	}
	dial()
	if err := closed(first); err != io.EOF {
		t.Fatalf("the first newcomer: %v, want it closed for the second (not the check, whose request had begun)", err)
	}
	fmt.Fprint(check, "st: x\r\n\r\n")
	check.SetReadDeadline(time.Now().Add(5 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(check), nil)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("a health check whose request had begun, after idle newcomers: %v, %v; want 200", res, err)
	}
}

// serveTest serves s on a free loopback port until the test ends and
// returns the port's address.
func serveTest(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	return ln.Addr().String()
}

// dialTest connects to addr, closing the connection when the test ends.
func dialTest(t *testing.T, addr string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}
