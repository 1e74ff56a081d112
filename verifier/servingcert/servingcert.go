// Package servingcert gives the verifier its TLS identity. When the
// operator configures no certificate, the verifier creates an ECDSA P-256
// key and a self-signed certificate in its state directory on first start
// (both files mode 0600) and reuses them afterwards, so the SPKI pin an
// agent was given stays valid across restarts and certificate renewals.
package servingcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"time"

	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/internal/atomicfile"
)

// File names inside the state directory.
const (
	KeyFile  = "tls.key"
	CertFile = "tls.crt"
)

// Load reads a configured certificate and key (PEM). The certificate file
// may carry the chain; the agent's pin may name any certificate in it.
func Load(certFile, keyFile string) (tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("load serving certificate: %w", err)
	}
	return c, nil
}

// LoadOrCreate returns the self-managed certificate in dir, creating the
// key and certificate on first use. now is the clock for the validity.
func LoadOrCreate(dir string, now time.Time) (tls.Certificate, error) {
	certPath, keyPath := filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile)
	c, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err == nil {
		return c, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return tls.Certificate{}, fmt.Errorf("load serving certificate from %s: %w", dir, err)
	}
	if _, serr := os.Stat(keyPath); serr == nil {
		return tls.Certificate{}, fmt.Errorf("%s exists without %s: refusing to replace a key an agent may pin", keyPath, certPath)
	}
	return create(dir, now)
}

func create(dir string, now time.Time) (tls.Certificate, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return tls.Certificate{}, fmt.Errorf("create state directory: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate serving key: %w", err)
	}
	der, err := selfSign(key, now)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("marshal serving key: %w", err)
	}
	defer clear(keyDER)
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	defer clear(keyPEM)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := atomicfile.Write(filepath.Join(dir, KeyFile), keyPEM, 0o600); err != nil {
		return tls.Certificate{}, err
	}
	if err := atomicfile.Write(filepath.Join(dir, CertFile), certPEM, 0o600); err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}

func selfSign(key *ecdsa.PrivateKey, now time.Time) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "latchkey-verifier"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              []string{"latchkey-verifier"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("self-sign serving certificate: %w", err)
	}
	return der, nil
}

// Pins returns the SPKI pin of every certificate in c's chain, leaf first.
func Pins(c tls.Certificate) ([]atls.Pin, error) {
	pins := make([]atls.Pin, 0, len(c.Certificate))
	for _, der := range c.Certificate {
		x, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("parse serving certificate: %w", err)
		}
		pins = append(pins, atls.PinOf(x))
	}
	return pins, nil
}
