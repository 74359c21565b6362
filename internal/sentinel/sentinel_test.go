package sentinel

import "testing"

func TestEventMaster(t *testing.T) {
	for payload, want := range map[string]string{
		"mymaster 127.0.0.1 6380 127.0.0.1 6381":                        "mymaster",
		"slave 127.0.0.1:6381 127.0.0.1 6381 @ mymaster 127.0.0.1 6380": "mymaster",
		"slave 10.0.0.2:6379 10.0.0.2 6379 @ other-name 10.0.0.1 6379":  "other-name",
		"": "",
	} {
		if got := eventMaster(payload); got != want {
			t.Errorf("eventMaster(%q) = %q, want %q", payload, got, want)
		}
	}
}
