package service_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/latchkey/latchkey/attest/attesttest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
)

// recordingStore adds binding.AttestationRecorder to a store, keeping what
// was recorded (the Lease store's own test is in verifier/binding).
type recordingStore struct {
	binding.Store
	mu   sync.Mutex
	recs []binding.Attestation
}

func (r *recordingStore) RecordAttestation(ctx context.Context, node, identity string, a binding.Attestation) error {
	rec, err := r.Get(ctx, binding.Node, node)
	if err != nil {
		return err
	}
	if err := binding.Check(rec, identity); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, a)
	return nil
}

func (r *recordingStore) recorded() []binding.Attestation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]binding.Attestation(nil), r.recs...)
}

func TestReattestReleasesNothingAndIsRecorded(t *testing.T) {
	m := &fakeMinter{}
	var rs *recordingStore
	e := startVerifier(t, envOpt{minter: m, challenge: true, store: func(s binding.Store) binding.Store {
		rs = &recordingStore{Store: s}
		return rs
	}})
	c := client(t, e, &attesttest.Issuer{})
	first, err := c.Get(context.Background(), worker(diskA))
	if err != nil || first.Token == "" {
		t.Fatalf("first join: %v", err)
	}
	re := worker(diskA)
	re.Rejoin, re.Reattest = true, true
	got, err := c.Get(context.Background(), re)
	if err != nil {
		t.Fatalf("re-attestation: %v", err)
	}
	if len(got.GetDiskKey()) != 0 || got.GetToken() != "" || len(got.GetApiServerEndpoints()) != 0 || got.GetCertificateKey() != "" {
		t.Fatalf("re-attestation ticket carries something: %v", got)
	}
	if m.minted != 1 {
		t.Fatalf("minted %d tokens, want only the first join's", m.minted)
	}
	recs := rs.recorded()
	if len(recs) != 1 || recs[0].Decision != binding.DecisionAttested || recs[0].Reason != "NONE" ||
		!strings.HasPrefix(recs[0].EvidenceDigest, "sha256:") || recs[0].Time.IsZero() {
		t.Fatalf("recorded %+v, want one attested result", recs)
	}
	// The token the join recorded is untouched.
	r, err := rs.Get(context.Background(), binding.Node, "node-1")
	if err != nil || r.TokenID != "abcdef" {
		t.Fatalf("node record after re-attestation: %+v %v", r, err)
	}
	if !strings.Contains(e.logs.String(), "purpose=reattest") {
		t.Fatalf("audit line without purpose=reattest:\n%s", e.logs)
	}
}

func TestReattestOfUnjoinedNodeRefused(t *testing.T) {
	e := startVerifier(t, envOpt{minter: &fakeMinter{}})
	re := worker(diskA)
	re.Rejoin, re.Reattest = true, true
	_, err := clientOnce(t, e, &attesttest.Issuer{}).Get(context.Background(), re)
	if r := refusal(t, err); r != latchkeyv1.Reason_IDENTITY_MISMATCH || !strings.Contains(err.Error(), "disk "+diskA+" has no bound record") {
		t.Fatalf("got %v (%v), want IDENTITY_MISMATCH naming the disk", r, err)
	}
}

func TestReattestOfAnotherMachinesNodeRefused(t *testing.T) {
	// The disk is bound to another machine than the fake validator names.
	e2 := startVerifier(t, envOpt{minter: &fakeMinter{}, store: func(s binding.Store) binding.Store {
		if _, err := s.Claim(context.Background(), binding.Disk, diskA, "other:machine"); err != nil {
			t.Fatal(err)
		}
		return s
	}})
	re := worker(diskA)
	re.Rejoin, re.Reattest = true, true
	_, err := clientOnce(t, e2, &attesttest.Issuer{}).Get(context.Background(), re)
	if r := refusal(t, err); r != latchkeyv1.Reason_IDENTITY_MISMATCH || !strings.Contains(err.Error(), "bound to another machine") {
		t.Fatalf("got %v (%v), want IDENTITY_MISMATCH", r, err)
	}
}

func TestReattestAskingForTokenIsMalformed(t *testing.T) {
	e := startVerifier(t, envOpt{minter: &fakeMinter{}})
	s := rawStream(t, e)
	h := baseHello()
	h.Rejoin, h.RequestToken, h.Purpose = true, true, latchkeyv1.Purpose_PURPOSE_REATTEST
	h.Evidence = fakeEvidence(t, bindingOf(t, s, h))
	s.Send(helloMsg(h))
	_, err := s.Recv()
	if code, r := statusReason(t, err); r != latchkeyv1.Reason_MALFORMED || code != codes.InvalidArgument || !strings.Contains(err.Error(), "cannot ask for a token") {
		t.Fatalf("got %v %v %v, want MALFORMED", code, r, err)
	}
}

func TestUnknownPurposeIsMalformed(t *testing.T) {
	e := startVerifier(t, envOpt{})
	s := rawStream(t, e)
	h := baseHello()
	h.Purpose = 7
	h.Evidence = fakeEvidence(t, bindingOf(t, s, h))
	s.Send(helloMsg(h))
	_, err := s.Recv()
	if _, r := statusReason(t, err); r != latchkeyv1.Reason_MALFORMED || !strings.Contains(err.Error(), "purpose 7 is not join or reattest") {
		t.Fatalf("got %v %v, want MALFORMED purpose", r, err)
	}
}

// A join's evidence cannot be replayed as a re-attestation (or the
// reverse): the purpose is in the binding.
func TestPurposeIsBound(t *testing.T) {
	e := startVerifier(t, envOpt{})
	s := rawStream(t, e)
	h := baseHello()
	h.Evidence = fakeEvidence(t, bindingOf(t, s, h))
	h.Purpose = latchkeyv1.Purpose_PURPOSE_REATTEST
	s.Send(helloMsg(h))
	_, err := s.Recv()
	if _, r := statusReason(t, err); r != latchkeyv1.Reason_BINDING_MISMATCH {
		t.Fatalf("reason %v, want BINDING_MISMATCH", r)
	}
}
