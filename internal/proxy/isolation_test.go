package proxy_test

// Holes in tenant isolation found by a security review, each test failing
// before its fix.

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
)

// GEORADIUS ... STORE x STORE other: Redis writes the last STORE's key,
// the proxy named only the first, so a tenant wrote outside its namespace
// (here over another tenant's key) and past its ACL.
func TestGeoradiusRepeatedStoreStaysInTheNamespace(t *testing.T) {
	p := nsProxy(t)
	rc := p.Redis.Client(t)
	if err := rc.Set(ctx, "b:secret", "tenant-b-data", 0).Err(); err != nil {
		t.Fatal(err)
	}
	a := nsClient(t, p, "tenant-a")
	if err := a.GeoAdd(ctx, "src", &redis.GeoLocation{Name: "Palermo", Longitude: 13.361389, Latitude: 38.115556}).Err(); err != nil {
		t.Fatal(err)
	}
	a.Do(ctx, "georadius", "src", "15", "37", "200", "km", "STORE", "x", "STORE", "b:secret")
	a.Do(ctx, "georadiusbymember", "src", "Palermo", "10", "km", "STORE", "y", "STOREDIST", "z", "STORE", "outside")
	if typ := rc.Type(ctx, "b:secret").Val(); typ != "string" {
		t.Errorf("tenant a overwrote b:secret (now a %s)", typ)
	}
	if n := rc.Exists(ctx, "outside").Val(); n != 0 {
		t.Errorf("tenant a wrote the unprefixed key outside")
	}
}

func TestGeoradiusRepeatedStoreIsCheckedByTheACL(t *testing.T) {
	p := usersProxy(t, func(c *config.Config) { c.Users = append(c.Users, user("geo", "geo-pw", "+@all ~app:*")) })
	rc := p.Redis.Client(t)
	c := loggedIn(t, p, "geo", "geo-pw")
	if err := c.GeoAdd(ctx, "app:src", &redis.GeoLocation{Name: "P", Longitude: 13.36, Latitude: 38.11}).Err(); err != nil {
		t.Fatal(err)
	}
	err := c.Do(ctx, "georadius", "app:src", "15", "37", "200", "km", "STORE", "app:x", "STORE", "other:k").Err()
	if err == nil {
		t.Error("GEORADIUS ... STORE app:x STORE other:k was not refused")
	}
	if n := rc.Exists(ctx, "other:k").Val(); n != 0 {
		t.Errorf("a ~app:* user wrote other:k")
	}
}
