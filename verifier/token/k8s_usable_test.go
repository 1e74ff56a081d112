//go:build k8s

package token

import (
	"context"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

// Against the real API server: a minted token authenticates as soon as
// Mint returns, and a made-up one (the control) does not.
func TestK8sTicketTokenAuthenticatesOnArrival(t *testing.T) {
	env := loadK8sEnv(t)
	rc, err := clientcmd.BuildConfigFromFlags("", env.Env["LATCHKEY_K8S_VERIFIER_KUBECONFIG"])
	if err != nil {
		t.Fatal(err)
	}
	check, err := NewAuthenticates(rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if ok, err := check(ctx, "zzzzzz.0123456789abcdef"); ok || err != nil {
		t.Fatalf("a token that was never minted: authenticates %v, %v", ok, err)
	}
	k := env.minter(t, func(c *KubeConfig) { c.Authenticates = check })
	for i := range 20 {
		g, err := k.Mint(ctx, workerReq("usable-"+string(rune('a'+i))))
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := check(ctx, g.Token); !ok || err != nil {
			t.Fatalf("mint %d: the ticket's token does not authenticate on arrival: %v, %v", i, ok, err)
		}
		if err := k.Revoke(ctx, g.ID); err != nil {
			t.Fatal(err)
		}
	}
}
