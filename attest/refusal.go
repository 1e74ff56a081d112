package attest

import (
	"errors"
	"fmt"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// Refusal is an error that carries the stable reason a join was refused.
// Validators return it for every failed check; the verifier service turns
// it into a gRPC status with a latchkeyv1.Refusal detail and logs the same
// reason in its audit line.
type Refusal struct {
	Reason latchkeyv1.Reason
	// Detail explains the refusal to a human. It never carries a secret.
	Detail string
	// Err is the underlying cause, if any (not sent to the agent).
	Err error
}

// Refuse builds a *Refusal with a formatted detail. A %w verb in format
// also becomes the wrapped cause.
func Refuse(reason latchkeyv1.Reason, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return &Refusal{Reason: reason, Detail: err.Error(), Err: errors.Unwrap(err)}
}

func (r *Refusal) Error() string {
	return r.Reason.String() + ": " + r.Detail
}

func (r *Refusal) Unwrap() error { return r.Err }

// ReasonOf returns the reason carried by err, INTERNAL for any other
// non-nil error, and REASON_UNSPECIFIED for nil.
func ReasonOf(err error) latchkeyv1.Reason {
	if err == nil {
		return latchkeyv1.Reason_REASON_UNSPECIFIED
	}
	var r *Refusal
	if errors.As(err, &r) {
		return r.Reason
	}
	return latchkeyv1.Reason_INTERNAL
}
