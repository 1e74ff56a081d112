package service

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/internal/logkey"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/policy"
)

// codeOf maps a reason to the gRPC code the agent's retry logic reads:
// Unavailable and Internal are transient, the rest are refusals that a
// retry with the same evidence cannot fix.
func codeOf(r latchkeyv1.Reason) codes.Code {
	switch r {
	case latchkeyv1.Reason_MALFORMED, latchkeyv1.Reason_UNKNOWN_VARIANT:
		return codes.InvalidArgument
	case latchkeyv1.Reason_UNAVAILABLE, latchkeyv1.Reason_COLLATERAL_MISSING:
		return codes.Unavailable
	case latchkeyv1.Reason_INTERNAL, latchkeyv1.Reason_REASON_UNSPECIFIED:
		return codes.Internal
	default:
		return codes.PermissionDenied
	}
}

// reasonOf also classifies the errors that are not refusals.
func reasonOf(err error) latchkeyv1.Reason {
	switch {
	case err == nil:
		return latchkeyv1.Reason_REASON_UNSPECIFIED
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled), errors.Is(err, errNotAcked):
		return latchkeyv1.Reason_UNAVAILABLE
	}
	return attest.ReasonOf(err)
}

// toStatus turns err into the status that ends the stream. Internal
// causes are not sent to the agent, only logged.
func toStatus(err error) error {
	if st := overloadedStatus(err); st != nil {
		return st
	}
	reason := reasonOf(err)
	detail := "internal error"
	var r *attest.Refusal
	if errors.As(err, &r) {
		detail = publicDetail(r)
	} else if reason == latchkeyv1.Reason_UNAVAILABLE {
		detail = "join did not complete"
	}
	refusal := &latchkeyv1.Refusal{Reason: reason, Detail: detail, WithdrawOffline: withdrawsOffline(reason)}
	if reason == latchkeyv1.Reason_UNAVAILABLE {
		refusal.RetryAfterMs = retryHint(err)
	}
	st, derr := status.New(codeOf(reason), reason.String()+": "+detail).WithDetails(refusal)
	if derr != nil {
		return status.Error(codes.Internal, "build status")
	}
	return st.Err()
}

// retryHint is the retry-after hint of a transient failure whose cause
// knows when the verifier can decide again (the etcd store without
// quorum), in milliseconds; 0 leaves the agent to its own backoff.
func retryHint(err error) uint32 {
	var h interface{ RetryAfter() time.Duration }
	if !errors.As(err, &h) {
		return 0
	}
	return uint32(min(h.RetryAfter(), maxRetryAfter).Milliseconds())
}

// audit writes the one line every join ends with. It names the node,
// variant, evidence digest, result and reason, never a key or token.
func (s *Service) audit(ctx context.Context, snap *policy.Snapshot, out *outcome, err error) {
	reason := reasonOf(err).String()
	if err == nil {
		reason = "NONE"
	}
	result := "accepted"
	level := slog.LevelInfo
	if err != nil {
		// The same words as the joins_total metric's result label: a
		// verifier that could not decide "failed", it did not refuse.
		result, level = "refused", slog.LevelWarn
		switch r := reasonOf(err); {
		case errors.Is(err, errNotAcked):
			result = "handover_failed"
		case r == latchkeyv1.Reason_INTERNAL || r == latchkeyv1.Reason_UNAVAILABLE:
			result = "failed"
		}
	}
	attrs := []any{
		logkey.Node, out.hello.GetNodeName(), logkey.DiskUUID, out.hello.GetDiskUuid(),
		logkey.Role, out.hello.GetRole().String(), logkey.Rejoin, out.hello.GetRejoin(), logkey.Purpose, purposeLabel(out.hello),
		logkey.Variant, out.hello.GetVariant().String(), logkey.EvidenceDigest, out.digest,
		logkey.Result, result, logkey.Reason, reason, logkey.Policy, snap.Digest,
		logkey.ValidationMS, float64(out.validation.Microseconds()) / 1000,
	}
	attrs = append(attrs, helloAttrs(out.hello)...)
	if out.verified != nil {
		attrs = append(attrs, logkey.Identity, out.verified.MachineID)
	}
	if out.boundIdentity != "" {
		attrs = append(attrs, logkey.BoundIdentity, out.boundIdentity)
	}
	if out.revoked != "" {
		attrs = append(attrs, logkey.Deny, out.revoked)
	}
	if len(out.adopted) > 0 {
		attrs = append(attrs, logkey.Adopted, strings.Join(out.adopted, ","))
	}
	if out.tokenID != "" {
		attrs = append(attrs, logkey.TokenID, out.tokenID)
	}
	attrs = append(attrs, shadowAttrs(out)...)
	if err != nil {
		attrs = append(attrs, logkey.Error, err.Error())
	}
	s.log.Log(ctx, level, "join decision", attrs...)
	s.cfg.Metrics.Join(out.hello.GetVariant(), asRefusal(err))
}

// asRefusal gives metrics the same reason the audit line names.
func asRefusal(err error) error {
	var r *attest.Refusal
	if err == nil || errors.As(err, &r) {
		return err
	}
	return &attest.Refusal{Reason: reasonOf(err), Detail: err.Error()}
}
