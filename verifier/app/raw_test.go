package app_test

import (
	"context"
	"crypto/x509"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/atls"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

func pinOf(t testing.TB, der []byte) atls.Pin {
	t.Helper()
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return atls.PinOf(c)
}

// stream opens a raw Join stream, for what a well-behaved agent never
// sends: replays and edited Hellos.
func (r *rig) stream(t *testing.T) latchkeyv1.JoinService_JoinClient {
	t.Helper()
	cfg, err := atls.ClientConfig([]atls.Pin{r.pin}, false)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("passthrough:///"+r.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)), grpc.WithDisableRetry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	s, err := latchkeyv1.NewJoinServiceClient(conn).Join(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// evidenceFor makes TPM evidence for hello bound to stream s's session.
func (r *rig) evidenceFor(t *testing.T, s latchkeyv1.JoinService_JoinClient, h *latchkeyv1.Hello) attest.Attestation {
	t.Helper()
	b, err := atls.PeerBinding(s.Context(), h)
	if err != nil {
		t.Fatal(err)
	}
	a, err := r.issuer(t).Attest(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// drive sends h and answers challenges with a, returning the final reason
// (REASON_UNSPECIFIED for a ticket).
func drive(t *testing.T, s latchkeyv1.JoinService_JoinClient, h *latchkeyv1.Hello, a attest.Attestation) latchkeyv1.Reason {
	t.Helper()
	if err := s.Send(&latchkeyv1.AgentMessage{Msg: &latchkeyv1.AgentMessage_Hello{Hello: h}}); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := s.Recv()
		if err != nil {
			return reasonOf(t, err)
		}
		if m.GetTicket() != nil {
			return latchkeyv1.Reason_REASON_UNSPECIFIED
		}
		resp, err := a.Respond(context.Background(), m.GetChallenge().GetPayload())
		if err != nil {
			t.Fatal(err)
		}
		s.Send(&latchkeyv1.AgentMessage{Msg: &latchkeyv1.AgentMessage_ChallengeResponse{ChallengeResponse: &latchkeyv1.ChallengeResponse{Payload: resp}}})
	}
}

func reasonOf(t *testing.T, err error) latchkeyv1.Reason {
	t.Helper()
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if r, ok := d.(*latchkeyv1.Refusal); ok {
			return r.GetReason()
		}
	}
	t.Fatalf("status %v carries no Refusal", err)
	return 0
}

func hello() *latchkeyv1.Hello {
	return &latchkeyv1.Hello{NodeName: "node-1", DiskUuid: diskA, Role: latchkeyv1.Role_ROLE_WORKER, Variant: latchkeyv1.Variant_VARIANT_TPM}
}

func TestTPMEvidenceReplayedOnAnotherSessionRefused(t *testing.T) {
	r := newRig(t, rigOpts{})
	h := hello()
	a := r.evidenceFor(t, r.stream(t), h)
	h.Evidence = a.Evidence()
	// The evidence is genuine and the activation is answered by the same
	// TPM; only the session differs.
	if got := drive(t, r.stream(t), h, a); got != latchkeyv1.Reason_BINDING_MISMATCH {
		t.Fatalf("reason %v, want BINDING_MISMATCH", got)
	}
	if len(r.tokenSecrets(t)) != 0 {
		t.Fatal("token written")
	}
}

func TestTPMEditedHelloRefused(t *testing.T) {
	for name, edit := range map[string]func(*latchkeyv1.Hello){
		"node name": func(h *latchkeyv1.Hello) { h.NodeName = "node-2" },
		"disk uuid": func(h *latchkeyv1.Hello) { h.DiskUuid = "00000000-0000-4000-8000-000000000001" },
		"role":      func(h *latchkeyv1.Hello) { h.Role = latchkeyv1.Role_ROLE_CONTROL_PLANE },
	} {
		t.Run(name, func(t *testing.T) {
			r := newRig(t, rigOpts{})
			s := r.stream(t)
			h := hello()
			a := r.evidenceFor(t, s, h)
			h.Evidence = a.Evidence()
			edit(h)
			if got := drive(t, s, h, a); got != latchkeyv1.Reason_BINDING_MISMATCH {
				t.Fatalf("reason %v, want BINDING_MISMATCH", got)
			}
			if len(r.tokenSecrets(t)) != 0 {
				t.Fatal("token written")
			}
		})
	}
}

func TestTPMUnknownVariantAndMalformedEvidenceRefused(t *testing.T) {
	r := newRig(t, rigOpts{})
	s := r.stream(t)
	h := hello()
	a := r.evidenceFor(t, s, h)
	h.Evidence = a.Evidence()
	h.Variant = latchkeyv1.Variant_VARIANT_SNP
	if got := drive(t, s, h, a); got != latchkeyv1.Reason_UNKNOWN_VARIANT {
		t.Fatalf("snp against a tpm-only policy: reason %v, want UNKNOWN_VARIANT", got)
	}
	h = hello()
	h.Evidence = []byte("\x0a\xff\xff\xff\x0fnot a TPMEvidence")
	if got := drive(t, r.stream(t), h, nil); got != latchkeyv1.Reason_MALFORMED {
		t.Fatalf("garbage evidence: reason %v, want MALFORMED", got)
	}
	if len(r.tokenSecrets(t)) != 0 {
		t.Fatal("token written")
	}
}
