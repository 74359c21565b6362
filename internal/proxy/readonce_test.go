package proxy_test

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
)

// The session's Reader and the pipe's reader wait for readability after a
// read that emptied the socket instead of reading again (resp.Reader.reads,
// upstream replyReader.readRaw). That is only correct if no bytes arriving
// at the moment of a short read are missed. Here, at once: a client whose
// every request arrives a byte at a time (each byte a short read, each
// request complete only at its last byte); clients in lock-step round trips,
// each sending its next request the moment its reply is in, which is the
// instant right after the proxy's short read; replies of a large value that
// Redis's writes and the pipe's reads cut anywhere; a client that sends half
// a command, pauses, and ends it; and one that hangs up mid-command. Any
// missed readiness shows as a client waiting forever for a reply (the read
// deadline turns that into a failure).
func TestReadOnceMissesNoBytesAtShortReads(t *testing.T) {
	p := proxytest.Start(t, redistest.Start(t), nil)
	setup := dialRaw(t, p.Addr)
	big := strings.Repeat("v", 300<<10)
	if v := setup.do("SET", "big", big); v != "OK" {
		t.Fatalf("SET big: %v", v)
	}
	if v := setup.do("SET", "small", "s"); v != "OK" {
		t.Fatalf("SET small: %v", v)
	}

	const lockstep, rounds = 8, 300
	var wg sync.WaitGroup
	errs := make(chan error, lockstep+3)
	reply := func(rd *bufio.Reader, nc net.Conn) (any, error) {
		nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		var types []byte
		return readValue(rd, &types)
	}
	dial := func() (net.Conn, *bufio.Reader, error) {
		nc, err := net.Dial("tcp", p.Addr)
		if err != nil {
			return nil, nil, err
		}
		return nc, bufio.NewReader(nc), nil
	}

	for c := 0; c < lockstep; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc, rd, err := dial()
			if err != nil {
				errs <- err
				return
			}
			defer nc.Close()
			for i := 0; i < rounds; i++ {
				key, want := "small", "s"
				if (i+c)%25 == 0 {
					key, want = "big", big
				}
				if _, err := nc.Write(resp.AppendCommandStrings(nil, "GET", key)); err != nil {
					errs <- err
					return
				}
				v, err := reply(rd, nc)
				if err != nil {
					errs <- fmt.Errorf("lock-step client %d, round %d: %v", c, i, err)
					return
				}
				if v != want {
					errs <- fmt.Errorf("lock-step client %d, round %d: GET %s returned %.20q", c, i, key, v)
					return
				}
			}
		}()
	}

	wg.Add(1)
	go func() { // a byte at a time, a pipeline of two requests per round
		defer wg.Done()
		nc, rd, err := dial()
		if err != nil {
			errs <- err
			return
		}
		defer nc.Close()
		for i := 0; i < 20; i++ {
			req := resp.AppendCommandStrings(nil, "ECHO", fmt.Sprintf("m%d", i))
			req = resp.AppendCommandStrings(req, "GET", "small")
			for _, b := range req {
				if _, err := nc.Write([]byte{b}); err != nil {
					errs <- err
					return
				}
			}
			for _, want := range []string{fmt.Sprintf("m%d", i), "s"} {
				v, err := reply(rd, nc)
				if err != nil || v != want {
					errs <- fmt.Errorf("byte-wise client, round %d: %v %v, want %q", i, v, err, want)
					return
				}
			}
		}
	}()

	wg.Add(1)
	go func() { // half a command, a pause, the rest
		defer wg.Done()
		nc, rd, err := dial()
		if err != nil {
			errs <- err
			return
		}
		defer nc.Close()
		req := resp.AppendCommandStrings(nil, "GET", "big")
		for i := 0; i < 5; i++ {
			half := len(req) / 2
			if _, err := nc.Write(req[:half]); err != nil {
				errs <- err
				return
			}
			time.Sleep(20 * time.Millisecond) // a pause, so the proxy waits holding half a request
			if _, err := nc.Write(req[half:]); err != nil {
				errs <- err
				return
			}
			if v, err := reply(rd, nc); err != nil || v != big {
				errs <- fmt.Errorf("paused client, round %d: %.20q %v", i, v, err)
				return
			}
		}
	}()

	wg.Add(1)
	go func() { // hangs up in the middle of a command
		defer wg.Done()
		for i := 0; i < 5; i++ {
			nc, _, err := dial()
			if err != nil {
				errs <- err
				return
			}
			req := resp.AppendCommandStrings(nil, "GET", "small")
			nc.Write(req[:len(req)-3])
			nc.Close()
		}
	}()

	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// The proxy still serves.
	if v := setup.do("GET", "small"); v != "s" {
		t.Fatalf("GET small after the run: %v", v)
	}
}
