package pkitest_test

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"testing"
	"time"

	"github.com/latchkey/latchkey/internal/pkitest"
)

// A leaf the CA issued verifies against the CA, for server auth, until
// its validity ends; the chain written to files loads as a TLS key pair;
// the pin is kubeadm's form.
func TestCAIssuesAVerifiableChain(t *testing.T) {
	ca := pkitest.NewCA(t, "test root")
	leaf := pkitest.Issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "leaf"}, DNSNames: []string{"leaf.test"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, ca)
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	opts := x509.VerifyOptions{Roots: roots, DNSName: "leaf.test"}
	if _, err := leaf.Cert.Verify(opts); err != nil {
		t.Fatalf("leaf does not verify against its CA: %v", err)
	}
	opts.CurrentTime = time.Now().Add(2 * time.Hour)
	if _, err := leaf.Cert.Verify(opts); err == nil {
		t.Fatal("leaf still valid two hours on")
	}
	if _, err := pkitest.NewCA(t, "test root").Cert.Verify(x509.VerifyOptions{Roots: roots}); err == nil {
		t.Fatal("a second CA of the same name verifies against the first")
	}
	if leaf.Cert.SerialNumber.Cmp(ca.Cert.SerialNumber) == 0 {
		t.Fatal("two certificates share a serial number")
	}

	certPath, keyPath := leaf.WriteFiles(t, t.TempDir(), "tls.crt", "tls.key", ca)
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if len(pair.Certificate) != 2 || string(pair.Certificate[1]) != string(ca.DER()) {
		t.Fatalf("written chain has %d certificates, want leaf and CA", len(pair.Certificate))
	}
	if got := leaf.TLSCertificate(ca).Certificate; len(got) != 2 || string(got[0]) != string(leaf.DER()) {
		t.Fatal("TLSCertificate: want leaf then CA")
	}

	block, _ := pem.Decode(ca.PEM())
	if block == nil || string(block.Bytes) != string(ca.DER()) ||
		ca.Pin() != fmt.Sprintf("sha256:%x", sha256.Sum256(ca.Cert.RawSubjectPublicKeyInfo)) {
		t.Fatalf("PEM or pin wrong: pin %s", ca.Pin())
	}
}

// SelfSigned is no CA: nothing it signs verifies.
func TestSelfSignedIsNoCA(t *testing.T) {
	c := pkitest.SelfSigned(t, "impostor")
	if c.Cert.IsCA || c.Cert.Subject.CommonName != "impostor" {
		t.Fatalf("IsCA %v, name %q", c.Cert.IsCA, c.Cert.Subject.CommonName)
	}
	child := pkitest.Issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "child"}}, c)
	roots := x509.NewCertPool()
	roots.AddCert(c.Cert)
	if _, err := child.Cert.Verify(x509.VerifyOptions{Roots: roots}); err == nil {
		t.Fatal("a certificate signed by a non-CA verifies")
	}
}

// CSRPEM's request parses, carries the template's names and its signature
// checks out.
func TestCSRPEM(t *testing.T) {
	block, _ := pem.Decode(pkitest.CSRPEM(t, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:n1", Organization: []string{"system:nodes"}}, DNSNames: []string{"n1"}}))
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		t.Fatal("no CERTIFICATE REQUEST block")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := req.CheckSignature(); err != nil {
		t.Fatal(err)
	}
	if req.Subject.CommonName != "system:node:n1" || req.Subject.Organization[0] != "system:nodes" || req.DNSNames[0] != "n1" {
		t.Fatalf("request %+v", req.Subject)
	}
}
