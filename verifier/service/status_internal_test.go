package service

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/latchkey/latchkey/attest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
)

// A join the etcd store could not decide ends UNAVAILABLE with the
// store's fixed detail and its retry hint; other transient failures carry
// no hint, and a policy refusal never does.
func TestUnavailableCarriesStoreRetryHint(t *testing.T) {
	refusalOf := func(err error) (codes.Code, *latchkeyv1.Refusal) {
		t.Helper()
		st := status.Convert(toStatus(err))
		for _, d := range st.Details() {
			if r, ok := d.(*latchkeyv1.Refusal); ok {
				return st.Code(), r
			}
		}
		t.Fatalf("no Refusal in %v", st)
		return 0, nil
	}
	etcdDown := &attest.Refusal{Reason: latchkeyv1.Reason_UNAVAILABLE, Detail: binding.EtcdUnavailableDetail,
		Err: &binding.EtcdUnavailableError{Op: "claim", Key: "/latchkey/bindings/x", Err: errors.New("context deadline exceeded")}}
	code, r := refusalOf(etcdDown)
	if code != codes.Unavailable || r.GetReason() != latchkeyv1.Reason_UNAVAILABLE || r.GetDetail() != binding.EtcdUnavailableDetail {
		t.Fatalf("etcd down: %v %v %q", code, r.GetReason(), r.GetDetail())
	}
	if got, want := r.GetRetryAfterMs(), uint32(binding.EtcdRetryAfter.Milliseconds()); got != want {
		t.Fatalf("retry_after_ms = %d, want %d", got, want)
	}
	// Another UNAVAILABLE (a mint that failed) leaves the agent to its backoff.
	_, r = refusalOf(&attest.Refusal{Reason: latchkeyv1.Reason_UNAVAILABLE, Detail: "x", Err: errors.New("apiserver down")})
	if r.GetRetryAfterMs() != 0 {
		t.Fatalf("a hint without a cause that knows one: %d", r.GetRetryAfterMs())
	}
	// A policy refusal wrapping the same cause (built to slip a hint in)
	// carries none.
	_, r = refusalOf(&attest.Refusal{Reason: latchkeyv1.Reason_PCR_MISMATCH, Detail: "pcr 7", Err: etcdDown.Err})
	if r.GetReason() != latchkeyv1.Reason_PCR_MISMATCH || r.GetRetryAfterMs() != 0 {
		t.Fatalf("policy refusal: %v hint %d", r.GetReason(), r.GetRetryAfterMs())
	}
}
