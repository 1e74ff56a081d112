package token

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// ReadSecret is the inverse of bootstrapSecret: what the mint wrote is
// what the admin API lists, for both roles, and the secret is not read.
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
