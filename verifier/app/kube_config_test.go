package app

import (
	"testing"

	"github.com/latchkey/latchkey/verifier/token"
)

// The API rate bound: zero is the default, negative is refused.
func TestKubernetesAPIQPS(t *testing.T) {
	c := &Config{ClusterSalt: "a", Policy: "p", Kubernetes: &Kubernetes{APIQPS: -1}}
	c.Defaults()
	if err := c.Validate(); err == nil || err.Error() != "kubernetes.apiQPS -1, apiBurst 0: want 0 (default) or more" {
		t.Fatalf("negative apiQPS: %v", err)
	}
	if got := tokenTTL(&Kubernetes{}); got != token.DefaultTTL {
		t.Fatalf("default token TTL %s", got)
	}
}
