package join

import (
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/kubernetes/cmd/kubeadm/app/util/pubkeypin"

	"github.com/latchkey/latchkey/internal/pkitest"
)

// The expressions the hand-written checks replace (names.go).
var (
	tokenRE   = regexp.MustCompile(`^([a-z0-9]{6})\.([a-z0-9]{16})$`)
	pinRE     = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	certKeyRE = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// agree fails t when a hand-written check and its oracle differ on s.
func agree(t *testing.T, s string) {
	t.Helper()
	if got, want := isToken(s), tokenRE.MatchString(s); got != want {
		t.Errorf("isToken(%q) = %v, the expression says %v", s, got, want)
	}
	if got, want := isPin(s), pinRE.MatchString(s); got != want {
		t.Errorf("isPin(%q) = %v, the expression says %v", s, got, want)
	}
	if got, want := isCertificateKey(s), certKeyRE.MatchString(s); got != want {
		t.Errorf("isCertificateKey(%q) = %v, the expression says %v", s, got, want)
	}
	if got, want := nodeNameError(s) == "", len(validation.IsDNS1123Subdomain(s)) == 0; got != want {
		t.Errorf("node name %q accepted %v, apimachinery says %v", s, got, want)
	}
}

// nameSeeds are inputs at each check's edges: one byte short or long, a
// capital, a separator moved, non-ASCII.
var nameSeeds = []string{
	"", ".", "-", "a", "A", "a-", "-a", "a.b", "a..b", "a.-b", "a-.b", "node-1", "Node_1", "node-1.",
	"a" + strings.Repeat(".a", 126), "a" + strings.Repeat(".a", 127), strings.Repeat("a", 253), strings.Repeat("a", 254),
	"abcdef.0123456789abcdef", "abcdef.0123456789abcde", "abcdef.0123456789abcdefa", "ABCDEF.0123456789abcdef",
	"abcdef-0123456789abcdef", "abcde.f0123456789abcdef", "abcdef.0123456789abcdeé",
	"sha256:" + strings.Repeat("a1", 32), "sha256:" + strings.Repeat("A1", 32), "sha256:" + strings.Repeat("a1", 31),
	"sha256:" + strings.Repeat("a1", 32) + "\n", "sha512:" + strings.Repeat("a1", 32), "sha256:" + strings.Repeat("g1", 32),
	strings.Repeat("c3", 32), strings.Repeat("c3", 31), strings.Repeat("C3", 32), strings.Repeat("c3", 32) + "0",
}

func TestNamesAgreeWithUpstream(t *testing.T) {
	for _, s := range nameSeeds {
		agree(t, s)
	}
}

func FuzzNamesAgreeWithUpstream(f *testing.F) {
	for _, s := range nameSeeds {
		f.Add(s)
	}
	f.Fuzz(agree)
}

// A refused node name carries apimachinery's own message.
func TestNodeNameErrorMessages(t *testing.T) {
	for _, s := range []string{"Node_1", strings.Repeat("a", 254), "-a"} {
		if got, want := nodeNameError(s), strings.Join(validation.IsDNS1123Subdomain(s), "; "); !strings.HasPrefix(want, got) || got == "" {
			t.Errorf("%q: %q, apimachinery says %q", s, got, want)
		}
	}
}

// pin and parseCertsPEM agree with kubeadm's pubkeypin and client-go's
// ParseCertsPEM, also on bundles with other blocks and on garbage.
func TestCertsAgreeWithUpstream(t *testing.T) {
	a, b := pkitest.NewCA(t, "a"), pkitest.NewCA(t, "b")
	key := []byte("-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n")
	headers := []byte("-----BEGIN CERTIFICATE-----\nProc-Type: 4,ENCRYPTED\n\nAAAA\n-----END CERTIFICATE-----\n")
	for name, in := range map[string][]byte{
		"one": a.PEM(), "two": append(a.PEM(), b.PEM()...), "key between": append(append(a.PEM(), key...), b.PEM()...),
		"headers skipped": append(headers, a.PEM()...), "only a key": key, "garbage": []byte("not pem"), "empty": nil,
		"bad DER": []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
	} {
		got, gerr := parseCertsPEM(in)
		want, werr := certutil.ParseCertsPEM(in)
		if (gerr == nil) != (werr == nil) || gerr != nil && gerr.Error() != werr.Error() {
			t.Errorf("%s: error %v, client-go's %v", name, gerr, werr)
			continue
		}
		if gerr != nil {
			continue
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d certificates, client-go finds %d", name, len(got), len(want))
		}
		for i := range got {
			if !got[i].Equal(want[i]) || pin(got[i]) != pubkeypin.Hash(want[i]) {
				t.Errorf("%s: certificate %d or its pin differs from upstream", name, i)
			}
		}
	}
}
