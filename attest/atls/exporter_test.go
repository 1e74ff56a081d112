package atls

import (
	"bytes"
	"context"
	"crypto/tls"
	"strings"
	"testing"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// TestSessionBindingAgreesAcrossTheHandshake runs two real TLS 1.3
// sessions: both ends of one session compute the same binding, and the
// second session's binding differs (replay on another session fails).
func TestSessionBindingAgreesAcrossTheHandshake(t *testing.T) {
	p := newTestPKI(t)
	cert := tls.Certificate{Certificate: [][]byte{p.leaf.Cert.Raw, p.inter.Cert.Raw}, PrivateKey: p.leaf.Key}
	clientCfg, err := ClientConfigFor([]Pin{pinOf(t, p.root), pinOf(t, p.inter)}, false, "verifier.test")
	if err != nil {
		t.Fatal(err)
	}
	hello := &latchkeyv1.Hello{NodeName: "node-1", Role: latchkeyv1.Role_ROLE_WORKER, Variant: latchkeyv1.Variant_VARIANT_TPM}
	session := func() (client, server []byte) {
		c, s := tlsPair(t, ServerConfig(cert), clientCfg)
		done := make(chan error, 1)
		go func() { done <- s.Handshake() }()
		if err := c.Handshake(); err != nil {
			t.Fatalf("client handshake: %v", err)
		}
		if err := <-done; err != nil {
			t.Fatalf("server handshake: %v", err)
		}
		cs, ss := c.ConnectionState(), s.ConnectionState()
		ekm, err := Exporter(&cs)
		if err != nil || len(ekm) != 32 {
			t.Fatalf("Exporter = %x, %v; want 32 bytes", ekm, err)
		}
		want, err := cs.ExportKeyingMaterial("EXPORTER-latchkey-attestation", nil, 32)
		if err != nil || !bytes.Equal(ekm, want) {
			t.Fatalf("Exporter = %x, want the session's EXPORTER-latchkey-attestation %x (%v)", ekm, want, err)
		}
		client, err = SessionBinding(&cs, hello)
		if err != nil {
			t.Fatal(err)
		}
		server, err = SessionBinding(&ss, hello)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(client, Binding(ekm, hello)) {
			t.Fatal("SessionBinding is not Binding over the session's exporter")
		}
		return client, server
	}
	c1, s1 := session()
	if !bytes.Equal(c1, s1) {
		t.Fatalf("client binding %x, server binding %x", c1, s1)
	}
	c2, _ := session()
	if bytes.Equal(c1, c2) {
		t.Fatal("two sessions produced the same binding")
	}
}

func TestExporterRefuses(t *testing.T) {
	p := newTestPKI(t)
	cert := tls.Certificate{Certificate: [][]byte{p.leaf.Cert.Raw}, PrivateKey: p.leaf.Key}
	tls12 := func(c *tls.Config) *tls.Config {
		c.MinVersion, c.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
		return c
	}
	c, s := tlsPair(t,
		tls12(&tls.Config{Certificates: []tls.Certificate{cert}}),
		tls12(&tls.Config{InsecureSkipVerify: true}))
	done := make(chan error, 1)
	go func() { done <- s.Handshake() }()
	if err := c.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	cs := c.ConnectionState()
	cases := []struct {
		name string
		cs   *tls.ConnectionState
		want string
	}{
		{"no state", nil, "tls handshake not complete"},
		{"handshake not complete", &tls.ConnectionState{Version: tls.VersionTLS13}, "tls handshake not complete"},
		{"TLS 1.2", &cs, "tls version 0x0303 is not TLS 1.3"},
	}
	for _, tc := range cases {
		if _, err := Exporter(tc.cs); err == nil || err.Error() != tc.want {
			t.Errorf("%s: Exporter = %v, want %q", tc.name, err, tc.want)
		}
		if _, err := SessionBinding(tc.cs, &latchkeyv1.Hello{}); err == nil || err.Error() != tc.want {
			t.Errorf("%s: SessionBinding = %v, want %q", tc.name, err, tc.want)
		}
	}
}

type plainAuth struct{}

func (plainAuth) AuthType() string { return "insecure" }

func TestPeerBindingRefuses(t *testing.T) {
	hello := &latchkeyv1.Hello{}
	if _, err := PeerBinding(context.Background(), hello); err == nil || err.Error() != "stream has no peer" {
		t.Errorf("PeerBinding(no peer) = %v", err)
	}
	ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: plainAuth{}})
	if _, err := PeerBinding(ctx, hello); err == nil || !strings.HasPrefix(err.Error(), "stream is not on TLS (auth atls.plainAuth)") {
		t.Errorf("PeerBinding(plain) = %v", err)
	}
	// A TLS peer whose handshake state is incomplete is refused by Exporter.
	ctx = peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{}})
	if _, err := PeerBinding(ctx, hello); err == nil || err.Error() != "tls handshake not complete" {
		t.Errorf("PeerBinding(incomplete TLS) = %v", err)
	}
}
