package ticket

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// RESOURCE_EXHAUSTED (admission) and UNAVAILABLE (a store without
// quorum) carry a hint; a policy refusal's is ignored; a hint is capped.
func TestRetryAfterOnlyWhenTransientAndCapped(t *testing.T) {
	r := &latchkeyv1.Refusal{Reason: latchkeyv1.Reason_UNAVAILABLE, RetryAfterMs: 250}
	if got := retryAfter(codes.ResourceExhausted, r); got != 250*time.Millisecond {
		t.Fatalf("hint %v, want 250ms", got)
	}
	if got := retryAfter(codes.Unavailable, r); got != 250*time.Millisecond {
		t.Fatalf("hint on Unavailable %v, want 250ms", got)
	}
	// A policy refusal that somehow carries a hint is still a refusal:
	// the slow refusal backoff applies, not the hint.
	refused := &latchkeyv1.Refusal{Reason: latchkeyv1.Reason_PCR_MISMATCH, RetryAfterMs: 250}
	if got := retryAfter(codes.PermissionDenied, refused); got != 0 {
		t.Fatalf("a hint on PermissionDenied was taken: %v", got)
	}
	r.RetryAfterMs = 3_600_000
	if got := retryAfter(codes.ResourceExhausted, r); got != maxRetryAfter {
		t.Fatalf("hint %v, want the cap %v", got, maxRetryAfter)
	}
}

// The jitter never waits less than the hint, nor more than 5/4 of it.
func TestJitterHintBounds(t *testing.T) {
	for range 1000 {
		if d := jitterHint(400 * time.Millisecond); d < 400*time.Millisecond || d > 500*time.Millisecond {
			t.Fatalf("jittered %v, want within [400ms, 500ms]", d)
		}
	}
}
