package ticket

import (
	"errors"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/codes"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// maxRetryAfter caps a verifier's retry-after hint: a hint is advice, and
// a verifier (or anything posing as one before the pin check, which the
// hint cannot come from) must not park the agent for longer.
const maxRetryAfter = 30 * time.Second

// retryAfter is the hint of a RESOURCE_EXHAUSTED refusal, 0 otherwise.
func retryAfter(code codes.Code, r *latchkeyv1.Refusal) time.Duration {
	if (code != codes.ResourceExhausted && code != codes.Unavailable) || r.GetRetryAfterMs() == 0 {
		return 0
	}
	return min(time.Duration(r.GetRetryAfterMs())*time.Millisecond, maxRetryAfter)
}

// busy reports the hint of a verifier at its admission limit.
func busy(err error) (time.Duration, bool) {
	var r *RefusedError
	if errors.As(err, &r) && r.RetryAfter > 0 {
		return r.RetryAfter, true
	}
	return 0, false
}

// jitterHint waits the hint plus up to a quarter more, so agents told the
// same time do not come back in the same millisecond; never less than
// the hint, which is when the verifier expects a slot to be free.
func jitterHint(d time.Duration) time.Duration {
	return d + rand.N(d/4+1)
}
