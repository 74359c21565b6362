package proxy_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
)

const channelDenied = "NOPERM No permissions to access a channel"

// channelsProxy has users with channel rules: news may use news.* (and
// PSUBSCRIBE exactly news.*), all may use every channel, none has no
// channel rule and so, as in Redis 7, may use no channel.
func channelsProxy(t *testing.T) *proxytest.Proxy {
	return proxytest.Start(t, nil, func(c *config.Config) {
		c.Users = []auth.UserConfig{
			user("news", "news-pw", "+@all ~* &news.*"),
			user("all", "all-pw", "+@all ~* allchannels"),
			user("none", "none-pw", "+@all ~*"),
		}
	})
}

func wantNoPerm(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil || err.Error() != channelDenied {
		t.Errorf("%s: %v, want %q", what, err, channelDenied)
	}
}

func TestACLChannelsPublish(t *testing.T) {
	p := channelsProxy(t)
	news, all, none := loggedIn(t, p, "news", "news-pw"), loggedIn(t, p, "all", "all-pw"), loggedIn(t, p, "none", "none-pw")
	if err := news.Publish(ctx, "news.eu", "x").Err(); err != nil {
		t.Errorf("PUBLISH news.eu as news: %v", err)
	}
	wantNoPerm(t, "PUBLISH sport as news", news.Publish(ctx, "sport", "x").Err())
	wantNoPerm(t, "SPUBLISH sport as news", news.SPublish(ctx, "sport", "x").Err())
	wantNoPerm(t, "PUBLISH news.eu as none", none.Publish(ctx, "news.eu", "x").Err())
	if err := all.Publish(ctx, "sport", "x").Err(); err != nil {
		t.Errorf("PUBLISH sport as all: %v", err)
	}
	// A refusal inside MULTI (counted too) fails the transaction, as Redis's does.
	_, err := news.TxPipelined(ctx, func(pp redis.Pipeliner) error {
		pp.Publish(ctx, "sport", "x")
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "EXECABORT") {
		t.Errorf("PUBLISH sport in MULTI as news: %v, want EXECABORT", err)
	}
	if got := grepLines(gatherText(t, p.Metrics), `redproxy_acl_denied_total{kind="channel"}`); !regexp.MustCompile(`counter:\{value:\s*4\s`).MatchString(got) {
		t.Errorf("channel denials counted: %q, want 4", got)
	}
}

func TestACLChannelsSubscribe(t *testing.T) {
	p := channelsProxy(t)
	news, all := loggedIn(t, p, "news", "news-pw"), loggedIn(t, p, "all", "all-pw")

	for _, c := range []struct {
		what string
		sub  func() *redis.PubSub
	}{
		{"SUBSCRIBE sport", func() *redis.PubSub { return news.Subscribe(ctx, "sport") }},
		{"SUBSCRIBE news.eu sport", func() *redis.PubSub { return news.Subscribe(ctx, "news.eu", "sport") }},
		{"SSUBSCRIBE sport", func() *redis.PubSub { return news.SSubscribe(ctx, "sport") }},
		{"PSUBSCRIBE news.eu (not the allowed pattern as written)", func() *redis.PubSub { return news.PSubscribe(ctx, "news.eu") }},
		{"PSUBSCRIBE *", func() *redis.PubSub { return news.PSubscribe(ctx, "*") }},
	} {
		ps := c.sub()
		_, err := ps.Receive(ctx)
		wantNoPerm(t, c.what, err)
		ps.Close()
	}

	// Allowed subscriptions receive what is published.
	ps := news.PSubscribe(ctx, "news.*")
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatalf("PSUBSCRIBE news.*: %v", err)
	}
	if err := all.Publish(ctx, "news.eu", "hello").Err(); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	msg, err := ps.ReceiveMessage(rctx)
	if err != nil || msg.Channel != "news.eu" || msg.Payload != "hello" {
		t.Fatalf("message on news.*: %+v %v", msg, err)
	}

	// A client already subscribed (relayed) is checked too.
	nc := p.Dial(t)
	rd := newReplyReader(nc)
	nc.Write([]byte("HELLO 3 AUTH news news-pw\r\n"))
	rd.skipReply(t)
	nc.Write([]byte("SUBSCRIBE news.eu\r\n"))
	rd.skipReply(t)
	nc.Write([]byte("SUBSCRIBE sport\r\nPSUBSCRIBE news.eu\r\nUNSUBSCRIBE sport\r\n"))
	for _, want := range []string{"-" + channelDenied, "-" + channelDenied, ">3"} {
		if got := rd.line(t); got != want {
			t.Fatalf("on a subscribed connection: %q, want %q", got, want)
		}
	}
}
