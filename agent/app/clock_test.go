package app

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/latchkey/latchkey/agent/exitcode"
	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/internal/pkitest"
)

// handshake runs the agent's TLS configuration, pinned to pinned,
// against a server presenting leaf with issuer's certificate after it,
// and returns the client's error.
func handshake(t *testing.T, pinned, issuer, leaf *pkitest.Cert) error {
	t.Helper()
	cfg, err := atls.ClientConfigFor([]atls.Pin{atls.PinOf(pinned.Cert)}, false, "verifier.example")
	if err != nil {
		t.Fatal(err)
	}
	client, server := net.Pipe()
	defer client.Close()
	go func() {
		defer server.Close()
		_ = tls.Server(server, atls.ServerConfig(leaf.TLSCertificate(issuer))).Handshake()
	}()
	return tls.Client(client, cfg).Handshake()
}

func leafFor(t *testing.T, ca *pkitest.Cert, notBefore, notAfter time.Time) *pkitest.Cert {
	return pkitest.Issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "verifier"}, DNSNames: []string{"verifier.example"},
		NotBefore: notBefore, NotAfter: notAfter, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, ca)
}

// TestClockBehindIsItsOwnExit: a verifier certificate (CA-pinned) not
// yet valid by this machine's clock exits clock-behind, which the unit
// restarts; an expired certificate and a wrong pin stay "not
// authenticated", which it does not.
func TestClockBehindIsItsOwnExit(t *testing.T) {
	ca := pkitest.NewCA(t, "verifier-ca")
	now := time.Now()
	other := pkitest.NewCA(t, "other-ca")
	for _, c := range []struct {
		name   string
		issuer *pkitest.Cert
		from   time.Duration // NotBefore and NotAfter, from now
		to     time.Duration
		want   int
	}{
		{"valid", ca, -time.Minute, 30 * time.Minute, exitcode.OK},
		// Issued "in the future" by this clock: the clock is behind.
		{"not yet valid", ca, 20 * time.Minute, 50 * time.Minute, exitcode.ClockBehind},
		// Expired: the certificate is at fault, or the clock is ahead.
		{"expired", ca, -50 * time.Minute, -20 * time.Minute, exitcode.VerifierNotAuthenticated},
		// Not yet valid, but from a CA nobody pinned: the pin is wrong.
		{"not yet valid, other CA", other, 20 * time.Minute, 50 * time.Minute, exitcode.VerifierNotAuthenticated},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := handshake(t, ca, c.issuer, leafFor(t, c.issuer, now.Add(c.from), now.Add(c.to)))
			if got := ExitCode(wrapLikeTicket(err)); got != c.want {
				t.Fatalf("handshake error %v: exit %d (%s), want %d (%s)", err, got, exitcode.Name(got), c.want, exitcode.Name(c.want))
			}
		})
	}
}

// wrapLikeTicket wraps a handshake error as agent/ticket reports the
// last attempt (the recorded pin error, under the endpoint).
func wrapLikeTicket(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("gave up: verifier.example:7443: %w", err)
}

func TestClockBehindNeedsAFutureNotBefore(t *testing.T) {
	now := time.Now()
	future := x509.CertificateInvalidError{Cert: &x509.Certificate{NotBefore: now.Add(time.Hour)}, Reason: x509.Expired}
	past := x509.CertificateInvalidError{Cert: &x509.Certificate{NotBefore: now.Add(-time.Hour), NotAfter: now.Add(-time.Minute)}, Reason: x509.Expired}
	other := x509.CertificateInvalidError{Cert: &x509.Certificate{NotBefore: now.Add(time.Hour)}, Reason: x509.NotAuthorizedToSign}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("%w: %w", atls.ErrPinMismatch, future), true},
		{fmt.Errorf("%w: %w", atls.ErrPinMismatch, past), false},
		{fmt.Errorf("%w: %w", atls.ErrPinMismatch, other), false},
		{x509.CertificateInvalidError{Reason: x509.Expired}, false}, // no certificate to look at
		{errors.New("current time is before"), false},
	} {
		if got := clockBehind(c.err, now); got != c.want {
			t.Errorf("clockBehind(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
