package tpm

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/internal/pkitest"
)

// testCA issues EK-style certificates: empty subject, critical
// subjectAltName, as the TCG EK credential profile prescribes.
type testCA struct {
	ca   *pkitest.Cert
	cert *x509.Certificate
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	ca := pkitest.NewCA(t, "test ek ca")
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return &testCA{ca: ca, cert: ca.Cert, pool: pool}
}

// issue certifies ek with a critical subjectAltName whose value is san.
func (ca *testCA) issue(t *testing.T, ek *rsa.PublicKey, san []byte) *x509.Certificate {
	t.Helper()
	return ca.ca.Certify(t, &x509.Certificate{
		KeyUsage:        x509.KeyUsageKeyEncipherment,
		ExtraExtensions: []pkix.Extension{{Id: oidSubjectAltName, Critical: true, Value: san}},
	}, ek)
}

// tpmSAN is a GeneralNames holding one directoryName with the TCG
// manufacturer, model and version attributes.
func tpmSAN(t *testing.T) []byte {
	t.Helper()
	name := pkix.RDNSequence{{
		{Type: asn1.ObjectIdentifier{2, 23, 133, 2, 1}, Value: "id:00001014"},
		{Type: asn1.ObjectIdentifier{2, 23, 133, 2, 2}, Value: "swtpm"},
		{Type: asn1.ObjectIdentifier{2, 23, 133, 2, 3}, Value: "id:20191023"},
	}}
	inner, err := asn1.Marshal(name)
	if err != nil {
		t.Fatal(err)
	}
	return mustSeq(t, asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: directoryNameTag, IsCompound: true, Bytes: inner})
}

func mustSeq(t *testing.T, names ...asn1.RawValue) []byte {
	t.Helper()
	der, err := asn1.Marshal(names)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func rsaKey(t *testing.T) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestVerifyEKCertHandlesTPMSubjectAltName(t *testing.T) {
	ca, ek := newTestCA(t), rsaKey(t)
	cert := ca.issue(t, &ek.PublicKey, tpmSAN(t))
	// Go alone refuses it; that is the reason for handleTPMSubjectAltName.
	if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err == nil {
		t.Fatal("x509 accepted the critical directoryName SAN by itself; the special case is obsolete")
	}
	if err := verifyEKCert(cert, ca.pool, &ek.PublicKey, time.Now()); err != nil {
		t.Fatalf("verifyEKCert: %v", err)
	}
}

func TestVerifyEKCertRefuses(t *testing.T) {
	ca, ek := newTestCA(t), rsaKey(t)
	otherName := asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: []byte{0x06, 0x01, 0x2a}}
	for name, tc := range map[string]struct {
		cert  func() *x509.Certificate
		roots *x509.CertPool
		key   *rsa.PublicKey
		now   time.Time
		want  string
	}{
		"another key":        {func() *x509.Certificate { return ca.issue(t, &ek.PublicKey, tpmSAN(t)) }, ca.pool, &rsaKey(t).PublicKey, time.Now(), "another key"},
		"untrusted ca":       {func() *x509.Certificate { return ca.issue(t, &ek.PublicKey, tpmSAN(t)) }, newTestCA(t).pool, &ek.PublicKey, time.Now(), "unknown authority"},
		"expired":            {func() *x509.Certificate { return ca.issue(t, &ek.PublicKey, tpmSAN(t)) }, ca.pool, &ek.PublicKey, time.Now().Add(2 * time.Hour), "expired"},
		"san with othername": {func() *x509.Certificate { return ca.issue(t, &ek.PublicKey, mustSeq(t, otherName)) }, ca.pool, &ek.PublicKey, time.Now(), "not a directoryName"},
	} {
		err := verifyEKCert(tc.cert(), tc.roots, tc.key, tc.now)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one mentioning %q", name, err, tc.want)
		}
	}
}
