package app

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"

	"github.com/latchkey/latchkey/verifier/adminapi"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/token"
)

func tokenSecret(id string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: bootstrapapi.BootstrapTokenSecretPrefix + id, Namespace: metav1.NamespaceSystem},
		Type:       bootstrapapi.SecretTypeBootstrapToken,
		Data:       map[string][]byte{bootstrapapi.BootstrapTokenIDKey: []byte(id), bootstrapapi.BootstrapTokenSecretKey: []byte("0123456789abcdef")},
	}
}

type recordingMinter struct{ revoked []string }

func (r *recordingMinter) Mint(context.Context, token.Request) (*token.Grant, error) { return nil, nil }
func (r *recordingMinter) Revoke(_ context.Context, id string) error {
	r.revoked = append(r.revoked, id)
	return nil
}

// narrowClient is a fake clientset that, like the shipped RBAC, refuses
// every Secret verb but delete, and honours dry-run deletes (the fake's
// tracker would delete).
func narrowClient(objs ...kruntime.Object) *fake.Clientset {
	c := fake.NewClientset(objs...)
	c.PrependReactor("*", "secrets", func(a k8stesting.Action) (bool, kruntime.Object, error) {
		d, ok := a.(k8stesting.DeleteActionImpl)
		if !ok {
			return true, nil, errors.New("forbidden: " + a.GetVerb() + " secrets")
		}
		if len(d.DeleteOptions.DryRun) == 0 {
			return false, nil, nil
		}
		_, err := c.Tracker().Get(d.GetResource(), d.GetNamespace(), d.GetName())
		return true, nil, err
	})
	return c
}

// The tokens are those the node records name whose Secrets exist; only
// those can be revoked, and a revoked token leaves its node's record.
func TestTokenAdminListsAndRevokesFromBindings(t *testing.T) {
	ctx := context.Background()
	c := narrowClient(tokenSecret("abcdef"), tokenSecret("foreig"))
	leases, err := binding.NewLeases(binding.LeaseConfig{Client: c, Logger: slog.New(slog.DiscardHandler), TokenTTL: 30 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for node, id := range map[string]string{"node-a": "abcdef", "node-b": "gone00"} {
		if _, err := leases.Claim(ctx, binding.Node, node, "tpm-ak:"+node); err != nil {
			t.Fatal(err)
		}
		if err := leases.SetToken(ctx, node, "tpm-ak:"+node, id); err != nil {
			t.Fatal(err)
		}
	}
	m := &recordingMinter{}
	ta := tokenAdmin{client: c, minter: m, bindings: leases}
	list, _, err := ta.List(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("list %v err %v, want node-a's token alone", list, err)
	}
	tk := list[0]
	if tk.GetId() != "abcdef" || tk.GetNodeName() != "node-a" || tk.GetExpiryUnix()-tk.GetCreatedUnix() != 1800 {
		t.Fatalf("token %+v", tk)
	}
	// The list cleared node-b's record, which named a gone token.
	if r, err := leases.Get(ctx, binding.Node, "node-b"); err != nil || r.TokenID != "" {
		t.Fatalf("node-b's record after the list: %+v %v", r, err)
	}
	if err := leases.SetToken(ctx, "node-b", "tpm-ak:node-b", "gone00"); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{
		"foreig": "token not found: not the token of any node this cluster's verifiers bound (latchkey deletes only its own)",
		"gone00": "token not found: node node-b's token, already gone (used, revoked or expired)",
	} {
		if err := ta.Revoke(ctx, id); !errors.Is(err, adminapi.ErrTokenNotFound) || err.Error() != want {
			t.Fatalf("revoke %s: %v, want %q", id, err, want)
		}
	}
	if len(m.revoked) != 0 {
		t.Fatalf("revoked %v, want nothing", m.revoked)
	}
	if err := ta.Revoke(ctx, "abcdef"); err != nil || strings.Join(m.revoked, ",") != "abcdef" {
		t.Fatalf("revoke: %v %v", err, m.revoked)
	}
	r, err := leases.Get(ctx, binding.Node, "node-a")
	if err != nil || r.TokenID != "" || !r.TokenExpiry.IsZero() || !r.Bound() {
		t.Fatalf("node-a's record after the revoke: %+v %v", r, err)
	}
}
