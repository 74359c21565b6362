package config

import (
	"bytes"
	"os"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the configuration loader: it must
// return a configuration or an error, never both or neither, and never
// panic or hang; a configuration it returns must pass Validate, which a
// reload and `redproxy check` run again.
func FuzzParse(f *testing.F) {
	if example, err := os.ReadFile("../../config.example.toml"); err == nil {
		f.Add(example)
	} else {
		f.Fatal(err)
	}
	for _, s := range []string{
		"",
		"[server]\nlisten = \"127.0.0.1:7000\"\nlog_level = \"warn\"\nidle_timeout = \"2s\"\n",
		"[upstream]\naddress = \"embedded\"\n",
		"[upstream]\nmode = \"cluster\"\nseeds = [\"10.0.0.1:7000\", \"node2:7001\"]\n",
		"[upstream]\nmode = \"sentinel\"\nsentinels = [\"127.0.0.1:26379\"]\nmaster_name = \"m\"\n",
		"[upstream]\npassword = \"s3cret-pw\"\n[server]\nlisten = \"0.0.0.0:6380\"\n",
		"[server]\nlisten = \"0.0.0.0:6380\"\n[[users]]\nname = \"app\"\npassword_sha256 = \"" +
			"2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b\"\nacl = \"+@all -@dangerous ~cache:*\"\nmax_connections = 2\n",
		"[[users]]\nname = \"app\"\npassword = \"plain\"\n",
		"[server.tls]\nlisten = \"127.0.0.1:0\"\ncert_file = \"missing.crt\"\nkey_file = \"missing.key\"\n",
		"[server]\nproxy_protocol = true\n",
		"[server.tls]\nhandshake_timeout = \"3s\"\n",
		"[[server.listeners]]\nname = \"internal\"\nlisten = \"127.0.0.1:0\"\nproxy_protocol = true\nnamespace = \"t:\"\n" +
			"[[policy.scope]]\nname = \"ops\"\nlisteners = [\"internal\", \"127.0.0.1:6380\"]\n",
		"[[server.listeners]]\nname = \"tls\"\nlisten = \"0.0.0.0:6381\"\ntls = true\ncert_file = \"missing.crt\"\n",
		"[[users]]\nname = \"app\"\npassword_sha256 = \"" +
			"2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b\"\nacl = \"+@all ~* resetchannels &news.* allchannels\"\n",
		"[[stampede.hold]]\npattern = \"cache:*\"\ntimeout = \"2s\"\n",
		"[policy]\n[[policy.scope]]\nname = \"app\"\n",
		"[server]\nmax_request_bytes = \"1KB\"\nmax_bulk_bytes = \"2KB\"\n",
		"a = [[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]\n",
		"[server\nlisten = \n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// Certificate files must be regular and at most 4 MiB (a device
		// such as /dev/zero is refused: TestCertificateFilesMustBeRegular),
		// but kernel files under /proc and /sys are regular files whose
		// reads may block (/proc/kmsg): the fuzzer is after the parser, so
		// those paths are left out.
		for _, dev := range []string{"/proc/", "/sys/"} {
			if bytes.Contains(data, []byte(dev)) {
				t.Skip("names a device or kernel file")
			}
		}
		cfg, err := Parse(data, "fuzz.toml")
		switch {
		case cfg == nil && err == nil:
			t.Fatalf("Parse(%q) returned neither a configuration nor an error", data)
		case cfg != nil && err != nil:
			t.Fatalf("Parse(%q) returned both a configuration and %v", data, err)
		case cfg != nil:
			if err := cfg.Validate(); err != nil {
				t.Fatalf("Parse(%q) accepted a configuration Validate refuses: %v", data, err)
			}
		}
	})
}
