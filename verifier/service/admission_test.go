package service_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/attest/attesttest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/metrics"
)

// holdChallenge starts a join whose Hello is valid and whose challenge is
// never answered; it returns once the challenge arrived. The returned
// function closes the stream.
func holdChallenge(t *testing.T, e *env, dial func(t *testing.T, e *env) latchkeyv1.JoinService_JoinClient) func() {
	t.Helper()
	s := dial(t, e)
	h := baseHello()
	h.Evidence = fakeEvidence(t, bindingOf(t, s, h))
	if err := s.Send(helloMsg(h)); err != nil {
		t.Fatal(err)
	}
	m, err := s.Recv()
	if err != nil || m.GetChallenge() == nil {
		t.Fatalf("want a challenge, got %v %v", m, err)
	}
	return func() { s.CloseSend(); s.Recv() }
}

// holdSlot takes the one admission slot of a verifier with maxInFlight 1
// and keeps it: a join waiting for its challenge answer gives its slot
// back while a challenge-wait place is free, and a source has one such
// place at this limit, so the first held challenge parks in it and the
// second keeps its slot. The returned function frees both.
func holdSlot(t *testing.T, e *env) func() {
	t.Helper()
	parked := holdChallenge(t, e, rawStream)
	holder := holdChallenge(t, e, rawStream)
	return func() { holder(); parked() }
}

// Past the in-flight limit a join is answered at once with
// RESOURCE_EXHAUSTED and a Refusal carrying retry_after_ms; it is counted,
// not audited, and the slot's holder is not disturbed.
func TestAdmissionLimitRefusesWithRetryAfter(t *testing.T) {
	m := metrics.New()
	e := startVerifier(t, envOpt{challenge: true, maxInFlight: 1, metrics: m})
	free := holdSlot(t, e)
	defer free()

	s := rawStream(t, e)
	h := baseHello()
	h.NodeName = "node-2"
	h.Evidence = fakeEvidence(t, bindingOf(t, s, h))
	s.Send(helloMsg(h))
	_, err := s.Recv()
	st, _ := status.FromError(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("code %v (%v), want ResourceExhausted", st.Code(), err)
	}
	var r *latchkeyv1.Refusal
	for _, d := range st.Details() {
		r, _ = d.(*latchkeyv1.Refusal)
	}
	if r == nil || r.GetReason() != latchkeyv1.Reason_UNAVAILABLE || r.GetDetail() != "verifier busy: retry after the hint" {
		t.Fatalf("refusal %v, want UNAVAILABLE 'verifier busy: retry after the hint'", r)
	}
	// No join ended yet: a slot time of 100 ms is assumed.
	if ms := r.GetRetryAfterMs(); ms < 20 || ms > 30000 {
		t.Fatalf("retry_after_ms = %d, want within [20, 30000]", ms)
	}
	if got := sample(t, m, "latchkey_verifier_admission_refused_total", ""); got != 1 {
		t.Fatalf("admission_refused_total = %v, want 1", got)
	}
	if got := sample(t, m, "latchkey_verifier_joins_in_flight", ""); got != 1 {
		t.Fatalf("joins_in_flight = %v, want 1", got)
	}
	if strings.Contains(e.logs.String(), "node=node-2") {
		t.Fatalf("a join refused at admission was audited:\n%s", e.logs)
	}
}

// The agent honours the hint: it waits about retry_after (not its own
// backoff), reports the wait through OnBusy rather than as a failed
// attempt, and is admitted once the slot frees.
func TestAgentHonoursRetryAfter(t *testing.T) {
	e := startVerifier(t, envOpt{challenge: true, maxInFlight: 1})
	free := holdSlot(t, e)
	var busy, failed atomic.Int32
	var hinted atomic.Int64
	c, err := ticket.New(ticket.Config{Endpoints: []string{e.addr}, Pins: []atls.Pin{e.pin}, Issuer: &attesttest.Issuer{},
		Timeout: 20 * time.Second, InitialBackoff: time.Hour, MaxBackoff: time.Hour, RefusalBackoff: time.Hour,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnBusy: func(d time.Duration) {
			hinted.Store(int64(d))
			if busy.Add(1) == 1 {
				free()
			}
		},
		OnAttemptFailed: func(error) { failed.Add(1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	req := worker("00000000-0000-4000-8000-000000000002")
	req.NodeName = "node-3"
	if _, err := c.Get(context.Background(), req); err != nil {
		t.Fatalf("join after the hint: %v", err)
	}
	if busy.Load() == 0 || failed.Load() != 0 {
		t.Fatalf("busy %d failed %d: want the hint honoured and no failed attempt", busy.Load(), failed.Load())
	}
	if d := time.Duration(hinted.Load()); d <= 0 || d > 30*time.Second {
		t.Fatalf("hint %v", d)
	}
}

// sample is the value of one series of m (label: "name=value", or "" for
// an unlabelled metric).
func sample(t *testing.T, m *metrics.Metrics, name, label string) float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, s := range mf.GetMetric() {
			var ls []string
			for _, l := range s.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			if strings.Join(ls, ",") != label {
				continue
			}
			if c := s.GetCounter(); c != nil {
				return c.GetValue()
			}
			return s.GetGauge().GetValue()
		}
	}
	t.Fatalf("no series %s{%s}", name, label)
	return 0
}
