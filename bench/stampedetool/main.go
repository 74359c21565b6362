// Command stampedetool is the load half of bench/stampede.sh: many clients
// reading one cache key cache-aside, through the proxy, while the key keeps
// expiring.
//
//	stampedetool -addr PROXY -redis REDIS [-clients 200] [-duration 10s]
//	             [-ttl 1s] [-fill 50ms] [-think 1ms] [-key cache:stampede]
//	             [-resp 3]
//
// Every client has its own connection and loops: GET key; on a miss it
// queries the "database" (sleeps -fill, counted) and SETs the key with a
// TTL of -ttl; then it waits -think. It prints one line
//
//	requests=N db_fetches=N redis_gets=N expiries=N p50_ms=X p99_ms=X max_ms=X
//
// where a request is one whole cache-aside read as the application sees it
// (including the database query on a miss), db_fetches counts database
// queries, and redis_gets is INFO commandstats cmdstat_get of the upstream
// Redis over the run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

func main() {
	addr := flag.String("addr", "", "proxy address host:port")
	redisAddr := flag.String("redis", "", "upstream Redis host:port, for INFO commandstats")
	clients := flag.Int("clients", 200, "concurrent clients, one connection each")
	duration := flag.Duration("duration", 10*time.Second, "how long to run")
	ttl := flag.Duration("ttl", time.Second, "TTL the clients give the key")
	fill := flag.Duration("fill", 50*time.Millisecond, "time one database query takes")
	think := flag.Duration("think", time.Millisecond, "pause between a client's requests")
	key := flag.String("key", "cache:stampede", "the key")
	// RESP2 is what most client libraries speak by default (go-redis v9,
	// the default here, speaks RESP3); the proxy takes other paths for it
	// (a lone RESP2 read leads its fetch as a direct reply).
	proto := flag.Int("resp", 3, "protocol the clients speak: 2 or 3")
	flag.Parse()
	if *proto != 2 && *proto != 3 {
		fmt.Fprintln(os.Stderr, "stampedetool: -resp must be 2 or 3")
		os.Exit(2)
	}
	if *addr == "" || *redisAddr == "" {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*addr, *redisAddr, *clients, *duration, *ttl, *fill, *think, *key, *proto); err != nil {
		fmt.Fprintln(os.Stderr, "stampedetool:", err)
		os.Exit(1)
	}
}

func run(addr, redisAddr string, clients int, duration, ttl, fill, think time.Duration, key string, proto int) error {
	ctx := context.Background()
	direct := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer direct.Close()
	if err := direct.Del(ctx, key).Err(); err != nil {
		return err
	}
	if err := direct.ConfigResetStat(ctx).Err(); err != nil {
		return err
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, Protocol: proto, PoolSize: clients, MaxIdleConns: clients, MaxRetries: -1, ReadTimeout: 30 * time.Second})
	defer rdb.Close()
	conns := make([]*redis.Conn, clients)
	for i := range conns {
		conns[i] = rdb.Conn()
		defer conns[i].Close()
		if err := conns[i].Ping(ctx).Err(); err != nil {
			return err
		}
	}

	var db atomic.Int64
	lat := make([][]time.Duration, clients)
	errc := make(chan error, clients)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			deadline := time.Now().Add(duration)
			for time.Now().Before(deadline) {
				t0 := time.Now()
				_, err := c.Get(ctx, key).Result()
				if errors.Is(err, redis.Nil) {
					db.Add(1)
					time.Sleep(fill) // the database query
					err = c.Set(ctx, key, "value", ttl).Err()
				}
				if err != nil {
					errc <- err
					return
				}
				lat[i] = append(lat[i], time.Since(t0))
				time.Sleep(think)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return err
	}

	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	q := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[int(p*float64(len(all)-1))]) / float64(time.Millisecond)
	}
	gets, err := getCalls(ctx, direct)
	if err != nil {
		return err
	}
	fmt.Printf("requests=%d db_fetches=%d redis_gets=%d expiries=%d p50_ms=%.3f p99_ms=%.3f max_ms=%.3f\n",
		len(all), db.Load(), gets, int(duration/ttl), q(0.50), q(0.99), q(1))
	return nil
}

func getCalls(ctx context.Context, c *redis.Client) (int, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_get:calls="); ok {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			return n, nil
		}
	}
	return 0, nil
}
