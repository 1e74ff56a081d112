package token

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"

	"github.com/latchkey/latchkey/internal/kubekey"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/protocol"
)

// ReadSecret (a reader kept in the tests) is the inverse of
// bootstrapSecret: what the mint wrote reads back, for both roles, and the
// secret is not read.
func TestReadSecretRoundTrip(t *testing.T) {
	exp := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, role := range []latchkeyv1.Role{latchkeyv1.Role_ROLE_WORKER, latchkeyv1.Role_ROLE_CONTROL_PLANE} {
		req := Request{NodeName: "node-a", Role: role, EvidenceDigest: testDigest}
		s := bootstrapSecret("abcdef", "0123456789abcdef", req, exp, false)
		if s.Name != SecretName("abcdef") {
			t.Fatalf("secret name %q, SecretName %q", s.Name, SecretName("abcdef"))
		}
		got, ok := ReadSecret(s)
		want := Info{ID: "abcdef", NodeName: "node-a", Role: role, EvidenceDigest: testDigest, Expiry: exp}
		if !ok || got != want {
			t.Fatalf("%v: ReadSecret = %+v %v, want %+v", role, got, ok, want)
		}
	}
}

func TestReadSecretMalformedAndForeign(t *testing.T) {
	s := bootstrapSecret("abcdef", "0123456789abcdef", workerReq("node-a"), testNow, false)
	s.Data[bootstrapapi.BootstrapTokenExpirationKey] = []byte("tomorrow")
	got, ok := ReadSecret(s)
	if !ok || !got.ExpirationMalformed || got.RawExpiration != "tomorrow" || !got.Expiry.IsZero() {
		t.Fatalf("malformed expiration read as %+v %v", got, ok)
	}
	delete(s.Data, bootstrapapi.BootstrapTokenExpirationKey)
	if got, _ := ReadSecret(s); got.ExpirationMalformed || !got.Expiry.IsZero() {
		t.Fatalf("no expiration read as %+v", got)
	}
	s.Type = corev1.SecretTypeOpaque
	if _, ok := ReadSecret(s); ok {
		t.Fatal("an Opaque Secret read as a bootstrap token")
	}
}

// roleFromLabel reads kubekey.LabelRole back; anything but control-plane is a
// worker, the token with fewer rights.
func roleFromLabel(v string) latchkeyv1.Role {
	if r, ok := protocol.ParseRole(v); ok {
		return r
	}
	return latchkeyv1.Role_ROLE_WORKER
}

// Info is what a token Secret written by bootstrapSecret says about its
// token; never the token's secret.
type Info struct {
	ID             string
	NodeName       string
	Role           latchkeyv1.Role
	EvidenceDigest string
	Created        time.Time
	// Expiry is zero when the Secret has no expiration, or one that does
	// not parse: then ExpirationMalformed is set and RawExpiration holds
	// it (the bootstrap authenticator treats such a token as expired).
	Expiry              time.Time
	ExpirationMalformed bool
	RawExpiration       string
}

// ReadSecret reads a token Secret's public fields, the inverse of
// bootstrapSecret. ok is false for a Secret that is not a bootstrap
// token.
func ReadSecret(s *corev1.Secret) (info Info, ok bool) {
	if s.Type != bootstrapapi.SecretTypeBootstrapToken {
		return Info{}, false
	}
	info = Info{
		ID:             string(s.Data[bootstrapapi.BootstrapTokenIDKey]),
		NodeName:       s.Annotations[kubekey.AnnotationNodeName],
		Role:           roleFromLabel(s.Labels[kubekey.LabelRole]),
		EvidenceDigest: s.Annotations[kubekey.AnnotationEvidenceDigest],
		Created:        s.CreationTimestamp.Time,
	}
	if raw, has := s.Data[bootstrapapi.BootstrapTokenExpirationKey]; has {
		if exp, err := time.Parse(time.RFC3339, string(raw)); err == nil {
			info.Expiry = exp
		} else {
			info.ExpirationMalformed, info.RawExpiration = true, string(raw)
		}
	}
	return info, true
}
