package service

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/latchkey/latchkey/attest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/protocol"
)

// joinStream is a join's stream with its inbox: one goroutine, started
// at the first recv, reads every message of the join for it. A wait for
// the agent must give up when its context ends (the handler's return then
// cancels the stream, which ends the blocked Recv), so the Recv cannot run
// on the handler's goroutine; one reader for the whole join instead of one
// per message spares a goroutine start, and the idle thread it wakes, for
// each message after the first, and never has two Recvs on one stream.
type joinStream struct {
	latchkeyv1.JoinService_JoinServer
	reading sync.Once
	inbox   chan *latchkeyv1.AgentMessage
	ended   chan struct{} // closed when the reader stops
	err     error         // why it stopped; read only after ended is closed
}

func newJoinStream(stream latchkeyv1.JoinService_JoinServer) *joinStream {
	return &joinStream{JoinService_JoinServer: stream, inbox: make(chan *latchkeyv1.AgentMessage, 1), ended: make(chan struct{})}
}

// read delivers messages until the stream fails or ends (the handler's
// return ends it). It reads at most one message ahead of the handler.
func (j *joinStream) read() {
	defer close(j.ended)
	done := j.Context().Done()
	for {
		m, err := j.Recv()
		if err != nil {
			j.err = err
			return
		}
		select {
		case j.inbox <- m:
		case <-done:
			j.err = j.Context().Err()
			return
		}
	}
}

// recv reads one message, giving up when ctx ends.
func recv(ctx context.Context, j *joinStream) (*latchkeyv1.AgentMessage, error) {
	j.reading.Do(func() { go j.read() })
	select {
	case m := <-j.inbox:
		return checked(m)
	case <-j.ended:
		// A message read before the stream ended comes first.
		select {
		case m := <-j.inbox:
			return checked(m)
		default:
			return nil, j.err
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// checked refuses a message that carries the codec's transport refusal.
func checked(m *latchkeyv1.AgentMessage) (*latchkeyv1.AgentMessage, error) {
	if err := transportRefusal(m); err != nil {
		return nil, err
	}
	return m, nil
}

// recvHello reads and validates the first message.
func recvHello(ctx context.Context, stream *joinStream) (*latchkeyv1.Hello, error) {
	m, err := recv(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("receive hello: %w", helloRecvError(err))
	}
	hello := m.GetHello()
	if hello == nil {
		return nil, attest.Refuse(latchkeyv1.Reason_MALFORMED, "first message is not a Hello")
	}
	if err := validateHello(hello); err != nil {
		// The caller audits what the refused Hello said.
		return hello, err
	}
	return hello, nil
}

// validateHello checks every Hello field before any of it is used.
func validateHello(h *latchkeyv1.Hello) error {
	if errs := validation.IsDNS1123Subdomain(h.GetNodeName()); len(errs) > 0 {
		return attest.Refuse(latchkeyv1.Reason_MALFORMED, "node name %.64q is not a DNS-1123 subdomain", h.GetNodeName())
	}
	if !protocol.ValidDiskUUID(h.GetDiskUuid()) {
		return attest.Refuse(latchkeyv1.Reason_MALFORMED, "disk uuid %.64q is not a canonical lower-case uuid", h.GetDiskUuid())
	}
	switch h.GetRole() {
	case latchkeyv1.Role_ROLE_WORKER, latchkeyv1.Role_ROLE_CONTROL_PLANE:
	default:
		return attest.Refuse(latchkeyv1.Reason_MALFORMED, "role %d is not worker or control-plane", h.GetRole())
	}
	if _, ok := latchkeyv1.Purpose_name[int32(h.GetPurpose())]; !ok {
		return attest.Refuse(latchkeyv1.Reason_MALFORMED, "purpose %d is not join or reattest", h.GetPurpose())
	}
	if len(h.GetEvidence()) == 0 {
		return attest.Refuse(latchkeyv1.Reason_MALFORMED, "hello carries no evidence")
	}
	if len(h.GetEvidence()) > MaxEvidenceSize {
		return attest.Refuse(latchkeyv1.Reason_MALFORMED, "evidence is %d bytes, limit %d", len(h.GetEvidence()), MaxEvidenceSize)
	}
	return nil
}

// challenger returns the RoundTrip a validator uses for challenges: send a
// Challenge, wait for the ChallengeResponse, at most MaxChallenges times.
// Each wait is bounded by Config.ChallengeTimeout (an agent with a real
// TPM answers in well under a second; a client without one never does)
// and holds no admission slot while a challenge-wait place is free
// (admission.go).
func (s *Service) challenger(stream *joinStream, out *outcome) attest.RoundTrip {
	n := 0
	return func(ctx context.Context, payload []byte) ([]byte, error) {
		n++
		if n > MaxChallenges {
			return nil, fmt.Errorf("more than %d challenges in one join", MaxChallenges)
		}
		// Park before the send: once the agent holds the challenge the
		// slot is already free, so nothing (an observer of the in-flight
		// count included) sees a waiting join holding one.
		resume := s.parkForChallenge(stream.Context(), out)
		msg := &latchkeyv1.VerifierMessage{Msg: &latchkeyv1.VerifierMessage_Challenge{Challenge: &latchkeyv1.Challenge{Payload: payload}}}
		if err := stream.Send(msg); err != nil {
			_ = resume(false)
			return nil, fmt.Errorf("send challenge: %w", err)
		}
		cctx, cancel := context.WithTimeout(ctx, s.cfg.ChallengeTimeout)
		m, err := recv(cctx, stream)
		timedOut := errors.Is(cctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil
		cancel()
		if rerr := resume(err == nil); rerr != nil {
			return nil, rerr
		}
		switch {
		case err != nil && timedOut:
			return nil, attest.Refuse(latchkeyv1.Reason_ACTIVATION_FAILED,
				"no answer to the challenge within %s (limits.challengeTimeout)", s.cfg.ChallengeTimeout)
		case err != nil:
			return nil, fmt.Errorf("receive challenge response: %w", err)
		}
		resp := m.GetChallengeResponse()
		if resp == nil {
			return nil, attest.Refuse(latchkeyv1.Reason_MALFORMED, "expected a ChallengeResponse")
		}
		return resp.GetPayload(), nil
	}
}
