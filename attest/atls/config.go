package atls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
)

// ErrPinMismatch is returned by the agent's handshake when the verifier
// presents no certificate matching a configured pin.
var ErrPinMismatch = errors.New("verifier certificate matches no configured pin")

// ServerConfig is the verifier's TLS configuration: TLS 1.3 only, no client
// certificate (the agent is authenticated by its evidence).
func ServerConfig(cert tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		MaxVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"h2"},
	}
}

// ClientConfig is the agent's TLS configuration for a verifier whose name
// is not known; see ClientConfigFor. With it only a pinned leaf can be
// accepted: a pinned CA needs the name to check.
func ClientConfig(pins []Pin, insecureSkipAuth bool) (*tls.Config, error) {
	return ClientConfigFor(pins, insecureSkipAuth, "")
}

// ClientConfigFor is the agent's TLS configuration for the verifier named
// serverName (the host of the address the agent dials, or an explicitly
// configured name). The verifier is authenticated by pins alone: the
// handshake succeeds only if the leaf certificate's SPKI matches a pin, or
// a certificate further up the chain the verifier sent matches a pin,
// signed the leaf (through any intermediates) and the leaf is valid for
// serverName. The name check is what keeps a pinned company CA from
// letting any server it signed pose as the verifier. With no pins the
// agent refuses unless insecureSkipAuth is set, which accepts any
// verifier and exists for lab use only.
func ClientConfigFor(pins []Pin, insecureSkipAuth bool, serverName string) (*tls.Config, error) {
	if len(pins) == 0 && !insecureSkipAuth {
		return nil, errors.New("no verifier pin configured (set a pin, or --insecure-skip-verifier-auth for lab use)")
	}
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS13,
		MaxVersion: tls.VersionTLS13,
		NextProtos: []string{"h2"},
		// Verification is by pin in VerifyConnection, not by Web PKI names.
		InsecureSkipVerify: true,
	}
	if len(pins) > 0 {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			return verifyPinned(cs.PeerCertificates, pins, serverName)
		}
	}
	return cfg, nil
}

// verifyPinned accepts the chain if the leaf is pinned, or if a pinned
// certificate in the chain is a CA that verifies the leaf and the leaf is
// valid for serverName.
func verifyPinned(chain []*x509.Certificate, pins []Pin, serverName string) error {
	if len(chain) == 0 {
		return fmt.Errorf("%w: verifier sent no certificate", ErrPinMismatch)
	}
	leaf := chain[0]
	if pinned(leaf, pins) {
		return nil
	}
	for i, c := range chain[1:] {
		if !pinned(c, pins) {
			continue
		}
		roots := x509.NewCertPool()
		roots.AddCert(c)
		inter := x509.NewCertPool()
		for _, m := range chain[1 : i+1] {
			inter.AddCert(m)
		}
		_, err := leaf.Verify(x509.VerifyOptions{
			Roots:         roots,
			Intermediates: inter,
			KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		})
		if err != nil {
			return fmt.Errorf("%w: pinned CA %s does not verify the leaf: %w", ErrPinMismatch, PinOf(c), err)
		}
		return checkName(leaf, c, serverName)
	}
	return fmt.Errorf("%w (leaf is %s)", ErrPinMismatch, PinOf(leaf))
}

// checkName requires a leaf accepted through a pinned CA to be valid for
// the verifier's name.
func checkName(leaf, ca *x509.Certificate, serverName string) error {
	if serverName == "" {
		return fmt.Errorf("%w: pinned CA %s signed the leaf, but no verifier name is known to check it against (pin the leaf, or give the verifier's name)",
			ErrPinMismatch, PinOf(ca))
	}
	if err := leaf.VerifyHostname(serverName); err != nil {
		return fmt.Errorf("%w: pinned CA %s signed a leaf that is not valid for %q: %v", ErrPinMismatch, PinOf(ca), serverName, err)
	}
	return nil
}

func pinned(c *x509.Certificate, pins []Pin) bool {
	got := PinOf(c)
	for _, p := range pins {
		if p.Equal(got) {
			return true
		}
	}
	return false
}
