package atls

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/internal/pkitest"
)

// issued is a certificate made in the test with its key.
type issued = pkitest.Cert

// testPKI is a real three-level chain (root → intermediate → leaf) plus the
// certificates the negative cases need.
type testPKI struct {
	root, inter, leaf *issued
	other             *issued // an unrelated root CA
	clientLeaf        *issued // signed by inter, but for client auth only
	expiredLeaf       *issued // signed by inter, expired an hour ago
}

func caTemplate(name string) *x509.Certificate {
	return &x509.Certificate{
		Subject:               pkix.Name{CommonName: name},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
}

func leafTemplate(name string, eku x509.ExtKeyUsage) *x509.Certificate {
	return &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		DNSNames:    []string{name},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{eku},
	}
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{}
	p.root = pkitest.Issue(t, caTemplate("latchkey test root"), nil)
	p.inter = pkitest.Issue(t, caTemplate("latchkey test intermediate"), p.root)
	p.leaf = pkitest.Issue(t, leafTemplate("verifier.test", x509.ExtKeyUsageServerAuth), p.inter)
	p.other = pkitest.Issue(t, caTemplate("unrelated root"), nil)
	p.clientLeaf = pkitest.Issue(t, leafTemplate("client.test", x509.ExtKeyUsageClientAuth), p.inter)
	expired := leafTemplate("expired.test", x509.ExtKeyUsageServerAuth)
	expired.NotBefore = time.Now().Add(-2 * time.Hour)
	expired.NotAfter = time.Now().Add(-time.Hour)
	p.expiredLeaf = pkitest.Issue(t, expired, p.inter)
	return p
}

// pinOf computes a pin without PinOf: SHA-256 over the DER SPKI marshalled
// from the public key.
func pinOf(t *testing.T, c *issued) Pin {
	t.Helper()
	spki, err := x509.MarshalPKIXPublicKey(&c.Key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	p, err := ParsePin("sha256:" + sha256Hex(spki))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// handshake runs a real TLS 1.3 handshake over loopback: the server uses
// ServerConfig with chain (chain[0]'s key signs), the client ClientConfig
// with pins. It returns the client's and the server's handshake errors.
func handshake(t *testing.T, chain []*issued, pins []Pin, serverName string) (clientErr, serverErr error) {
	t.Helper()
	cert := tls.Certificate{PrivateKey: chain[0].Key}
	for _, c := range chain {
		cert.Certificate = append(cert.Certificate, c.Cert.Raw)
	}
	clientCfg, err := ClientConfigFor(pins, false, serverName)
	if err != nil {
		t.Fatalf("ClientConfigFor: %v", err)
	}
	return runHandshake(t, ServerConfig(cert), clientCfg)
}

func runHandshake(t *testing.T, serverCfg, clientCfg *tls.Config) (clientErr, serverErr error) {
	t.Helper()
	c, s := tlsPair(t, serverCfg, clientCfg)
	serverDone := make(chan error, 1)
	go func() { serverDone <- s.Handshake() }()
	clientErr = c.Handshake()
	if clientErr != nil {
		// Unblock a server still waiting for the client's flight.
		_ = c.Close()
	}
	return clientErr, <-serverDone
}

// tlsPair connects a TLS client and server over a loopback TCP connection.
func tlsPair(t *testing.T, serverCfg, clientCfg *tls.Config) (*tls.Conn, *tls.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			accepted <- nil
			return
		}
		accepted <- conn
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	srvRaw := <-accepted
	if srvRaw == nil {
		t.Fatal("accept failed")
	}
	deadline := time.Now().Add(10 * time.Second)
	_ = raw.SetDeadline(deadline)
	_ = srvRaw.SetDeadline(deadline)
	c, s := tls.Client(raw, clientCfg), tls.Server(srvRaw, serverCfg)
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

// TestPinnedHandshake checks every pin case in a real TLS 1.3 handshake:
// the pin is checked inside the handshake, so a refused verifier never
// completes it (the server sees the client's bad_certificate alert).
func TestPinnedHandshake(t *testing.T) {
	p := newTestPKI(t)
	leafIs := "(leaf is " + pinOf(t, p.leaf).String() + ")"
	notVerified := func(ca *issued) string {
		return ErrPinMismatch.Error() + ": pinned CA " + pinOf(t, ca).String() + " does not verify the leaf: "
	}
	cases := []struct {
		name  string
		chain []*issued
		pins  []*issued
		// wantErr is "" for an accepted verifier, else the start of the
		// client's error (which must wrap ErrPinMismatch).
		wantErr string
		// wantCause, when set, is a further substring of the error.
		wantCause string
		// verifierName is the name the agent expects ("verifier.test"
		// when empty; "-" for none).
		verifierName string
	}{
		{name: "leaf pinned, full chain sent", chain: []*issued{p.leaf, p.inter, p.root}, pins: []*issued{p.leaf}},
		{name: "leaf pinned, leaf alone", chain: []*issued{p.leaf}, pins: []*issued{p.leaf}},
		{name: "intermediate pinned", chain: []*issued{p.leaf, p.inter}, pins: []*issued{p.inter}},
		{name: "intermediate pinned, root sent too", chain: []*issued{p.leaf, p.inter, p.root}, pins: []*issued{p.inter}},
		{name: "root pinned, through the intermediate", chain: []*issued{p.leaf, p.inter, p.root}, pins: []*issued{p.root}},
		{name: "several pins, one matches the root", chain: []*issued{p.leaf, p.inter, p.root}, pins: []*issued{p.other, p.root}},
		{name: "several pins, one matches the leaf", chain: []*issued{p.leaf, p.inter}, pins: []*issued{p.other, p.leaf}},
		{
			name:    "no pin matches",
			chain:   []*issued{p.leaf, p.inter, p.root},
			pins:    []*issued{p.other},
			wantErr: ErrPinMismatch.Error() + " " + leafIs,
		},
		{
			name:    "root pinned but not sent",
			chain:   []*issued{p.leaf, p.inter},
			pins:    []*issued{p.root},
			wantErr: ErrPinMismatch.Error() + " " + leafIs,
		},
		{
			name:      "pinned CA in chain did not sign the leaf",
			chain:     []*issued{p.leaf, p.other},
			pins:      []*issued{p.other},
			wantErr:   notVerified(p.other),
			wantCause: "certificate signed by unknown authority",
		},
		{
			name:      "root pinned, intermediate withheld",
			chain:     []*issued{p.leaf, p.root},
			pins:      []*issued{p.root},
			wantErr:   notVerified(p.root),
			wantCause: "certificate signed by unknown authority",
		},
		{
			name:      "pinned CA, leaf not for server auth",
			chain:     []*issued{p.clientLeaf, p.inter},
			pins:      []*issued{p.inter},
			wantErr:   notVerified(p.inter),
			wantCause: "incompatible key usage",
		},
		{
			name:      "pinned CA, leaf expired",
			chain:     []*issued{p.expiredLeaf, p.inter},
			pins:      []*issued{p.inter},
			wantErr:   notVerified(p.inter),
			wantCause: "expired",
		},
		{
			// A pinned leaf is trusted by its key alone, as documented:
			// the pin is the whole of the verifier's authentication.
			name:  "expired leaf pinned directly",
			chain: []*issued{p.expiredLeaf, p.inter},
			pins:  []*issued{p.expiredLeaf},
		},
		{
			name:         "pinned CA, leaf for another name",
			chain:        []*issued{p.leaf, p.inter},
			pins:         []*issued{p.inter},
			verifierName: "other.test",
			wantErr:      ErrPinMismatch.Error() + ": pinned CA " + pinOf(t, p.inter).String() + ` signed a leaf that is not valid for "other.test"`,
			wantCause:    "certificate is valid for verifier.test, not other.test",
		},
		{
			name:         "pinned CA, no verifier name known",
			chain:        []*issued{p.leaf, p.inter},
			pins:         []*issued{p.inter},
			verifierName: "-",
			wantErr:      ErrPinMismatch.Error() + ": pinned CA " + pinOf(t, p.inter).String() + " signed the leaf, but no verifier name is known",
		},
		{
			// A pinned leaf needs no name: the key is the identity.
			name:         "leaf pinned, another name",
			chain:        []*issued{p.leaf, p.inter},
			pins:         []*issued{p.leaf},
			verifierName: "other.test",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var pins []Pin
			for _, c := range tc.pins {
				pins = append(pins, pinOf(t, c))
			}
			serverName := tc.verifierName
			switch serverName {
			case "":
				serverName = "verifier.test"
			case "-":
				serverName = ""
			}
			clientErr, serverErr := handshake(t, tc.chain, pins, serverName)
			if tc.wantErr == "" {
				if clientErr != nil || serverErr != nil {
					t.Fatalf("handshake refused: client %v, server %v", clientErr, serverErr)
				}
				return
			}
			if clientErr == nil {
				t.Fatalf("handshake accepted, want %q", tc.wantErr)
			}
			if !errors.Is(clientErr, ErrPinMismatch) {
				t.Fatalf("client error %v does not wrap ErrPinMismatch", clientErr)
			}
			if !strings.HasPrefix(clientErr.Error(), tc.wantErr) {
				t.Fatalf("client error\n  %v\nwant prefix\n  %s", clientErr, tc.wantErr)
			}
			if !strings.Contains(clientErr.Error(), tc.wantCause) {
				t.Fatalf("client error %v does not name the cause %q", clientErr, tc.wantCause)
			}
			if serverErr == nil || !strings.Contains(serverErr.Error(), "bad certificate") {
				t.Fatalf("server error %v, want the client's bad_certificate alert", serverErr)
			}
		})
	}
}

func TestVerifyPinnedEmptyChain(t *testing.T) {
	p := newTestPKI(t)
	err := verifyPinned(nil, []Pin{pinOf(t, p.leaf)}, "verifier.test")
	if !errors.Is(err, ErrPinMismatch) || err.Error() != ErrPinMismatch.Error()+": verifier sent no certificate" {
		t.Fatalf("verifyPinned(no chain) = %v", err)
	}
}

func TestClientConfigWithoutPins(t *testing.T) {
	_, err := ClientConfig(nil, false)
	want := "no verifier pin configured (set a pin, or --insecure-skip-verifier-auth for lab use)"
	if err == nil || err.Error() != want {
		t.Fatalf("ClientConfig(no pins) = %v, want %q", err, want)
	}
	// The lab escape hatch accepts any verifier, here one that matches no
	// pin anyone has.
	p := newTestPKI(t)
	cfg, err := ClientConfig(nil, true)
	if err != nil {
		t.Fatal(err)
	}
	cert := tls.Certificate{Certificate: [][]byte{p.other.Cert.Raw}, PrivateKey: p.other.Key}
	if cErr, sErr := runHandshake(t, ServerConfig(cert), cfg); cErr != nil || sErr != nil {
		t.Fatalf("insecure handshake: client %v, server %v", cErr, sErr)
	}
}

// TestTLS13Only checks both configurations refuse a TLS 1.2 peer.
func TestTLS13Only(t *testing.T) {
	p := newTestPKI(t)
	cert := tls.Certificate{Certificate: [][]byte{p.leaf.Cert.Raw}, PrivateKey: p.leaf.Key}
	client, err := ClientConfig([]Pin{pinOf(t, p.leaf)}, false)
	if err != nil {
		t.Fatal(err)
	}
	old := &tls.Config{MaxVersion: tls.VersionTLS12, InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}}
	if cErr, _ := runHandshake(t, ServerConfig(cert), old); cErr == nil || !strings.Contains(cErr.Error(), "protocol version") {
		t.Errorf("TLS 1.2 client against ServerConfig: %v, want a protocol version refusal", cErr)
	}
	if cErr, _ := runHandshake(t, old, client); cErr == nil || !strings.Contains(cErr.Error(), "protocol version") {
		t.Errorf("ClientConfig against a TLS 1.2 server: %v, want a protocol version refusal", cErr)
	}
}
