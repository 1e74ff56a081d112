package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/agent/ticket"
)

func loadYAML(t *testing.T, body string) (*Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return LoadFile(path, true)
}

// offline.after: strict, a duration of at least 1s, and by default one
// round of the configured endpoints plus a few seconds, from the ticket
// client's per-attempt timeout.
func TestOfflineAfter(t *testing.T) {
	c := base()
	c.Verifiers = []string{"a:1", "b:1", "c:1"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if got, want := c.Offline.After.Duration, 3*ticket.DefaultAttemptTimeout+5*time.Second; got != want || want != ticket.DefaultOfflineAfter(3) {
		t.Fatalf("default offline.after %s, want %s", got, want)
	}
	f, err := loadYAML(t, "offline:\n  after: 90s\n")
	if err != nil || f.Offline.After.Duration != 90*time.Second {
		t.Fatalf("offline.after 90s: %v, %v", err, f)
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown key", "offline:\n  afer: 1m\n", `unknown field "offline.afer"`},
		{"case variant", "offline:\n  After: 1m\n", `unknown field "offline.After"`},
		{"duplicate", "offline:\n  after: 1m\n  after: 2m\n", `already set in map`},
		{"not a duration", "offline:\n  after: soon\n", `soon`},
	} {
		if _, err := loadYAML(t, tc.yaml); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: err = %v, want it to contain %q", tc.name, err, tc.want)
		}
	}
	for _, d := range []time.Duration{-time.Second, 500 * time.Millisecond} {
		c := base()
		c.Offline.After.Duration = d
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "offline.after "+d.String()+" is below 1s") {
			t.Fatalf("offline.after %s: %v", d, err)
		}
	}
	c = base()
	c.Offline.After.Duration = time.Second // the bound itself is accepted
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}
