package app

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/adminapi"
	"github.com/latchkey/latchkey/verifier/token"
)

func tokenSecret(id, expiration string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: bootstrapapi.BootstrapTokenSecretPrefix + id, Namespace: metav1.NamespaceSystem,
			Labels:      map[string]string{token.LabelManagedBy: token.ManagedBy, token.LabelRole: "control-plane"},
			Annotations: map[string]string{token.AnnotationNode: "node-" + id, token.AnnotationEvidence: "sha256:ee"}},
		Type: bootstrapapi.SecretTypeBootstrapToken,
		Data: map[string][]byte{bootstrapapi.BootstrapTokenIDKey: []byte(id), bootstrapapi.BootstrapTokenSecretKey: []byte("0123456789abcdef"),
			bootstrapapi.BootstrapTokenExpirationKey: []byte(expiration)},
	}
}

type recordingMinter struct{ revoked []string }

func (r *recordingMinter) Mint(context.Context, token.Request) (*token.Grant, error) { return nil, nil }
func (r *recordingMinter) Revoke(_ context.Context, id string) error {
	r.revoked = append(r.revoked, id)
	return nil
}

func TestTokenAdminListsAndMarksMalformedExpiry(t *testing.T) {
	other := tokenSecret("zzzzzz", "2030-01-01T00:00:00Z")
	other.Labels = nil // not ours
	c := fake.NewClientset(tokenSecret("abcdef", "2030-01-01T00:00:00Z"), tokenSecret("ghijkl", "tomorrow"), other)
	m := &recordingMinter{}
	ta := tokenAdmin{client: c, minter: m}
	list, err := ta.List(context.Background())
	if err != nil || len(list) != 2 {
		t.Fatalf("list %v err %v, want the two latchkey tokens", list, err)
	}
	byID := map[string]bool{}
	for _, tk := range list {
		byID[tk.GetId()] = tk.GetExpirationMalformed()
		if tk.GetRole() != latchkeyv1.Role_ROLE_CONTROL_PLANE || tk.GetNodeName() != "node-"+tk.GetId() {
			t.Errorf("token %+v", tk)
		}
	}
	if byID["abcdef"] || !byID["ghijkl"] {
		t.Fatalf("malformed marks %v", byID)
	}
	if err := ta.Revoke(context.Background(), "nosuch"); !errors.Is(err, adminapi.ErrTokenNotFound) {
		t.Fatalf("revoke unknown: %v", err)
	}
	if err := ta.Revoke(context.Background(), "abcdef"); err != nil || len(m.revoked) != 1 {
		t.Fatalf("revoke: %v %v", err, m.revoked)
	}
}
