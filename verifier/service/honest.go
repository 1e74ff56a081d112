package service

// Honest reasons and a bounded audit: what the agent is
// told, what the audit line records, and what is only counted.

import (
	"context"
	"errors"
	"io"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/internal/logkey"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/metrics"
	"github.com/latchkey/latchkey/verifier/policy"
)

// internalCause is what an agent is told instead of the cause of an
// UNAVAILABLE or INTERNAL refusal: the cause (an API server error with
// its internal addresses, a store's path) stays in the verifier's log.
const internalCause = "verifier-side failure (cause in the verifier log)"

// publicDetail is the Refusal detail sent to the agent: for a transient
// refusal with a wrapped cause, the cause's text is replaced by
// internalCause; every other detail goes as it is.
func publicDetail(r *attest.Refusal) string {
	switch r.Reason {
	case latchkeyv1.Reason_UNAVAILABLE, latchkeyv1.Reason_INTERNAL:
	default:
		return r.Detail
	}
	if r.Err == nil {
		return r.Detail
	}
	cause := r.Err.Error()
	if head, ok := strings.CutSuffix(r.Detail, ": "+cause); ok {
		return head + ": " + internalCause
	}
	if strings.Contains(r.Detail, cause) {
		return internalCause
	}
	return r.Detail
}

// helloRecvError turns a failed read of the first message into the
// reason it deserves: a half-close before any Hello is MALFORMED (the
// agent ended the join without starting it), not INTERNAL.
func helloRecvError(err error) error {
	if errors.Is(err, io.EOF) {
		return &attest.Refusal{Reason: latchkeyv1.Reason_MALFORMED, Detail: "stream closed before a Hello", Err: errNoHello}
	}
	if st, ok := status.FromError(err); ok && st.Code() == codes.Canceled {
		return errors.Join(errNoHello, err)
	}
	return err
}

// errNoHello marks a stream that ended before its Hello arrived.
var errNoHello = errors.New("no hello")

// overloadedStatus is the status of a join refused at admission: gRPC
// RESOURCE_EXHAUSTED with a Refusal carrying retry_after_ms.
func overloadedStatus(err error) error {
	var o *errOverloaded
	if !errors.As(err, &o) {
		return nil
	}
	r := overloadedRefusal(o)
	st, derr := status.New(codes.ResourceExhausted, r.GetReason().String()+": "+r.GetDetail()).WithDetails(r)
	if derr != nil {
		return status.Error(codes.ResourceExhausted, "verifier busy")
	}
	return st.Err()
}

// record ends a join: the audit line for every join that sent a Hello;
// a join refused at admission or a stream that never sent a Hello is
// only counted (a flood of either must not become a flood of log lines),
// with a debug line.
func (s *Service) record(ctx context.Context, snap *policy.Snapshot, out *outcome, err error) {
	var o *errOverloaded
	switch {
	case errors.As(err, &o) && !out.admitted:
		s.log.Debug("join refused at admission", logkey.Node, out.hello.GetNodeName(),
			logkey.RetryAfterMS, o.retryAfter.Milliseconds())
		return
	case out.hello == nil:
		cause := metrics.NoHelloOther
		switch {
		case errors.Is(err, errNoHello):
			cause = metrics.NoHelloClosed
		case reasonOf(err) == latchkeyv1.Reason_MALFORMED:
			cause = metrics.NoHelloMalformed
		case errors.Is(err, context.DeadlineExceeded):
			cause = metrics.NoHelloTimeout
		}
		s.cfg.Metrics.StreamWithoutHello(cause)
		s.log.Debug("stream ended without a hello", logkey.Reason, reasonOf(err).String(), logkey.Error, errString(err))
		return
	}
	s.audit(ctx, snap, out, err)
	s.noteOffline(ctx, out, err) // offline.go
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// helloAttrs are the audit fields known once the Hello has arrived.
func helloAttrs(h *latchkeyv1.Hello) []any {
	attrs := []any{logkey.RequestToken, h.GetRequestToken()}
	if h.DiskKeyGeneration != nil {
		// The master-secret generation the disk's header names, so the
		// audit shows which disks still need an older secret.
		attrs = append(attrs, logkey.KeyGeneration, h.GetDiskKeyGeneration())
	}
	return attrs
}

// auditableHello is what the audit line may print of a Hello that failed
// validation: its fields cut to a bound, the evidence dropped.
func auditableHello(h *latchkeyv1.Hello) *latchkeyv1.Hello {
	if h == nil {
		return nil
	}
	cut := func(s string) string {
		if len(s) > 64 {
			return s[:64] + "..."
		}
		return strings.ToValidUTF8(s, "?")
	}
	return &latchkeyv1.Hello{NodeName: cut(h.GetNodeName()), DiskUuid: cut(h.GetDiskUuid()), Role: h.GetRole(),
		Rejoin: h.GetRejoin(), RequestToken: h.GetRequestToken(), Variant: h.GetVariant(),
		DiskKeyGeneration: h.DiskKeyGeneration}
}
