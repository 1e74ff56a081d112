// Package pkitest issues throwaway X.509 certificates for tests: a CA,
// the certificates it signs, their PEM, key files and kubeadm-style pins,
// so no test package writes its own x509.CreateCertificate scaffolding.
// Every key is a fresh P-256 key that lives only in memory or in the
// test's own temporary folder.
//
// Test only: scripts/test.sh fails the build check when a shipped binary
// links it.
package pkitest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Cert is an issued certificate and its private key.
type Cert struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// NewCA is a self-signed CA named name (certificate signing, basic
// constraints), valid from an hour ago for two hours.
func NewCA(tb testing.TB, name string) *Cert {
	return Issue(tb, &x509.Certificate{Subject: pkix.Name{CommonName: name}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}, nil)
}

// SelfSigned is a self-signed certificate named name that is no CA (a
// TLS server nobody issued, a signing certificate).
func SelfSigned(tb testing.TB, name string) *Cert {
	return Issue(tb, &x509.Certificate{Subject: pkix.Name{CommonName: name}}, nil)
}

// Issue signs tmpl for a fresh key with parent's key, or with its own key
// when parent is nil (self-signed). A template without a serial number
// gets a random one, and without NotBefore/NotAfter the validity from an
// hour ago to an hour from now (so a check at now+2h sees it expired).
// tb may be nil for a package-level fixture; then a failure panics.
func Issue(tb testing.TB, tmpl *x509.Certificate, parent *Cert) *Cert {
	if tb != nil {
		tb.Helper()
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		fail(tb, err)
	}
	signer, signerCert := crypto.Signer(key), tmpl
	if parent != nil {
		signer, signerCert = parent.Key, parent.Cert
	}
	return &Cert{Cert: create(tb, tmpl, signerCert, &key.PublicKey, signer), Key: key}
}

// Certify signs tmpl for pub, a key held elsewhere (a TPM's EK), with
// ca's key. Serial and validity default as in Issue.
func (ca *Cert) Certify(tb testing.TB, tmpl *x509.Certificate, pub any) *x509.Certificate {
	if tb != nil {
		tb.Helper()
	}
	return create(tb, tmpl, ca.Cert, pub, ca.Key)
}

func create(tb testing.TB, tmpl, parent *x509.Certificate, pub any, signer crypto.Signer) *x509.Certificate {
	if tmpl.SerialNumber == nil {
		serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
		if err != nil {
			fail(tb, err)
		}
		tmpl.SerialNumber = serial
	}
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore = time.Now().Add(-time.Hour)
	}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotAfter = time.Now().Add(time.Hour)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		fail(tb, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		fail(tb, err)
	}
	return cert
}

// DER is the certificate's DER encoding.
func (c *Cert) DER() []byte { return c.Cert.Raw }

// PEM is the certificate as one PEM block.
func (c *Cert) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Cert.Raw})
}

// KeyPEM is the private key as a PKCS #8 PEM block.
func (c *Cert) KeyPEM(tb testing.TB) []byte {
	tb.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(c.Key)
	if err != nil {
		tb.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// Pin is kubeadm's pin of the certificate's public key:
// sha256:<hex of the SubjectPublicKeyInfo digest>.
func (c *Cert) Pin() string {
	sum := sha256.Sum256(c.Cert.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// TLSCertificate is c with its key, the chain after it, for a tls.Config.
func (c *Cert) TLSCertificate(chain ...*Cert) tls.Certificate {
	tc := tls.Certificate{Certificate: [][]byte{c.Cert.Raw}, PrivateKey: c.Key, Leaf: c.Cert}
	for _, ca := range chain {
		tc.Certificate = append(tc.Certificate, ca.Cert.Raw)
	}
	return tc
}

// WriteFiles writes the certificate (then the chain after it) and the key
// as PEM into dir, as certName and keyName, mode 0600, and returns their
// paths.
func (c *Cert) WriteFiles(tb testing.TB, dir, certName, keyName string, chain ...*Cert) (certPath, keyPath string) {
	tb.Helper()
	certPEM := c.PEM()
	for _, ca := range chain {
		certPEM = append(certPEM, ca.PEM()...)
	}
	certPath, keyPath = filepath.Join(dir, certName), filepath.Join(dir, keyName)
	if err := os.WriteFile(certPath, certPEM, 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(keyPath, c.KeyPEM(tb), 0o600); err != nil {
		tb.Fatal(err)
	}
	return certPath, keyPath
}

func fail(tb testing.TB, err error) {
	if tb == nil {
		panic(fmt.Sprintf("pkitest: %v", err))
	}
	tb.Helper()
	tb.Fatal(err)
}

// CSRPEM is a PEM certificate request for tmpl, signed by a fresh P-256
// key (a kubelet's, a client's) that is then thrown away.
func CSRPEM(tb testing.TB, tmpl *x509.CertificateRequest) []byte {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		tb.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}
