package config

import (
	"bytes"
	"fmt"

	"github.com/pelletier/go-toml/v2"

	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/stampede"
)

// RedactedPassword stands in for upstream.password in Effective's output.
const RedactedPassword = "<redacted>"

// Effective renders the snapshot as a TOML document with every setting,
// the defaults filled in, so an operator sees what the proxy would run with
// (redproxy check). upstream.password (and sentinel_password) is replaced by RedactedPassword when
// set: the output ends up in terminals and tickets. Apart from that, parsing
// the output gives back the same configuration.
func (c *Config) Effective() ([]byte, error) {
	shown := *c
	// 0 stands for the default: shown as the value in force (found by a
	// probe: check printed '0s' for a 10 s timeout).
	shown.Server.TLS.HandshakeTimeout.Duration = c.Server.TLS.Handshake()
	// The same for the value-size limit and early refresh's beta, whose 0
	// is not "off" (a probe: check printed '0' for a 100 KB limit in force).
	// New values and slices: snapshots are never modified.
	shown.Policy.Values = valuesShown(c.Policy.Values)
	if len(c.Policy.Scopes) > 0 {
		shown.Policy.Scopes = append([]policy.Scope(nil), c.Policy.Scopes...)
		for i := range shown.Policy.Scopes {
			shown.Policy.Scopes[i].Values = valuesShown(shown.Policy.Scopes[i].Values)
		}
	}
	if len(c.Stampede.EarlyRefresh) > 0 {
		shown.Stampede.EarlyRefresh = append([]stampede.RefreshRule(nil), c.Stampede.EarlyRefresh...)
		for i := range shown.Stampede.EarlyRefresh {
			shown.Stampede.EarlyRefresh[i].Beta = shown.Stampede.EarlyRefresh[i].BetaInForce()
		}
	}
	if shown.Upstream.Password != "" {
		shown.Upstream.Password = RedactedPassword
	}
	if shown.Upstream.SentinelPassword != "" {
		shown.Upstream.SentinelPassword = RedactedPassword
	}
	if len(c.Upstreams) > 0 {
		// The named upstreams' credentials are as secret as [upstream]'s;
		// a new map, as snapshots are never modified.
		shown.Upstreams = make(map[string]Upstream, len(c.Upstreams))
		for name, u := range c.Upstreams {
			if u.Password != "" {
				u.Password = RedactedPassword
			}
			if u.SentinelPassword != "" {
				u.SentinelPassword = RedactedPassword
			}
			shown.Upstreams[name] = u
		}
	}
	var buf bytes.Buffer
	enc := toml.NewEncoder(&buf).SetIndentTables(false)
	if err := enc.Encode(&shown); err != nil {
		return nil, fmt.Errorf("config: rendering the effective configuration: %w", err)
	}
	return buf.Bytes(), nil
}

// valuesShown is v with its limit as in force (0 stands for the default).
func valuesShown(v *policy.ValueRules) *policy.ValueRules {
	if v == nil || v.MaxValueBytes != 0 {
		return v
	}
	shown := *v
	shown.MaxValueBytes = v.LimitInForce()
	return &shown
}
