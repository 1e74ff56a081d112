package config

import (
	"strings"
	"testing"
	"time"
)

func base() *Config {
	return &Config{NodeName: "node-1", Verifiers: []string{"verifier.example:7443"},
		VerifierPins: []string{"sha256:" + strings.Repeat("ab", 32)}}
}

func TestVerifierAddressesNormalised(t *testing.T) {
	for in, want := range map[string]string{
		"verifier.example":      "verifier.example:7443",
		"10.0.0.1:9000":         "10.0.0.1:9000",
		"[fd00::1]":             "[fd00::1]:7443",
		"[fd00::1]:7443":        "[fd00::1]:7443",
		"verifier.example:7443": "verifier.example:7443",
	} {
		c := base()
		c.Verifiers = []string{in}
		if err := c.Validate(); err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if c.Verifiers[0] != want {
			t.Errorf("%q became %q, want %q", in, c.Verifiers[0], want)
		}
	}
}

func TestLocalMistakesRefusedWithTheFix(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"https url", func(c *Config) { c.Verifiers = []string{"https://v.example:7443/"} },
			`verifier "https://v.example:7443/": give host:port without a scheme (e.g. "v.example:7443")`},
		{"bad port", func(c *Config) { c.Verifiers = []string{"v.example:http"} }, `port "http" is not a number from 1 to 65535`},
		{"bare ipv6", func(c *Config) { c.Verifiers = []string{"fd00::1"} }, "write an IPv6 address as [addr]:port"},
		{"upper-case node name", func(c *Config) { c.NodeName = "Node-1" }, `node name "Node-1" is not a valid Kubernetes node name`},
		{"underscore node name", func(c *Config) { c.NodeName = "node_1" }, "set nodeName: or --node-name"},
		{"node name label ending in a dash", func(c *Config) { c.NodeName = "node-.example" }, `node name "node-.example" is not`},
		{"node name with an empty label", func(c *Config) { c.NodeName = "node..example" }, `node name "node..example" is not`},
		{"node name of 254 characters", func(c *Config) { c.NodeName = strings.Repeat("a.", 126) + "aa" }, "is not a valid Kubernetes node name"},
		{"negative timeout", func(c *Config) { c.Timeout.Duration = -time.Second }, "timeout -1s is negative"},
		{"key-only without uuid", func(c *Config) { c.Disk.Mode = "key-only" }, "disk mode key-only needs the disk's UUID"},
		{"upper-case uuid", func(c *Config) {
			c.Disk.Mode, c.Disk.UUID = "key-only", "3F2A9C1E-5B7D-4E8F-9A0B-1C2D3E4F5A6B"
		}, "is not a canonical lower-case UUID"},
		{"cri socket without scheme", func(c *Config) { c.Join.CRISocket = "/run/containerd/containerd.sock" },
			`join.criSocket "/run/containerd/containerd.sock": want unix:///absolute/path`},
		{"cri socket relative", func(c *Config) { c.Join.CRISocket = "unix://run/containerd.sock" }, "want unix:///absolute/path"},
		{"negative cri wait", func(c *Config) { c.Join.CRIWait.Duration = -time.Second }, "join.criWait -1s is negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.edit(c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// The longest valid node name and one with every allowed kind of
// character pass the same check that refuses their near misses above.
func TestNodeNamesAccepted(t *testing.T) {
	for _, name := range []string{strings.Repeat("a.", 126) + "a", "0-node.example-1.b2", "n"} {
		c := base()
		c.NodeName = name
		if err := c.Validate(); err != nil {
			t.Errorf("%q: %v", name, err)
		}
	}
}
