package ticket

import (
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/latchkey/latchkey/attest/atls"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// ErrUnreachable means no verifier gave a ticket or a refusal in time.
var ErrUnreachable = errors.New("no verifier reachable")

// ErrStopped means the agent was told to stop (SIGTERM) before a ticket
// arrived; it is not a verifier failure.
var ErrStopped = errors.New("stopped")

// RefusedError is a verifier's refusal with its stable reason.
type RefusedError struct {
	Code   codes.Code
	Reason latchkeyv1.Reason
	Detail string
	// RetryAfter is the verifier's hint when it was at its admission
	// limit (gRPC RESOURCE_EXHAUSTED): come back after about this long.
	RetryAfter time.Duration
	// WithdrawOffline: the verifier withdrew the node's offline grant
	// (Refusal.withdraw_offline); the node erases it.
	WithdrawOffline bool
}

func (e *RefusedError) Error() string {
	return "verifier refused: " + e.Reason.String() + ": " + e.Detail
}

// Transient reports whether a retry may succeed without a policy change
// (the verifier was unavailable or failed internally).
func (e *RefusedError) Transient() bool {
	switch e.Reason {
	case latchkeyv1.Reason_UNAVAILABLE, latchkeyv1.Reason_INTERNAL, latchkeyv1.Reason_COLLATERAL_MISSING:
		return true
	}
	return false
}

// fromStatus extracts a RefusedError from a gRPC status that carries a
// Refusal detail; other errors come back unchanged.
func fromStatus(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, d := range st.Details() {
		if r, ok := d.(*latchkeyv1.Refusal); ok {
			return &RefusedError{Code: st.Code(), Reason: r.GetReason(), Detail: r.GetDetail(), RetryAfter: retryAfter(st.Code(), r),
				WithdrawOffline: r.GetWithdrawOffline()}
		}
	}
	return err
}

func reasonString(err error) string {
	var r *RefusedError
	if errors.As(err, &r) {
		return r.Reason.String()
	}
	if errors.Is(err, atls.ErrPinMismatch) {
		return "PIN_MISMATCH"
	}
	return "UNREACHABLE"
}
