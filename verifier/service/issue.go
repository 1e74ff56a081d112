package service

import (
	"context"
	"errors"
	"fmt"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/internal/logkey"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/metrics"
	"github.com/latchkey/latchkey/verifier/policy"
	"github.com/latchkey/latchkey/verifier/token"
)

// errNotAcked marks a ticket that was sent but never acknowledged.
var errNotAcked = errors.New("ticket not acknowledged")

// issue derives the disk key, mints a token when one is due, and hands the
// ticket over. It owns the minted token until the agent acknowledges.
func (s *Service) issue(ctx context.Context, stream *joinStream, snap *policy.Snapshot, hello *latchkeyv1.Hello, out *outcome) error {
	keys, err := s.diskKeys(hello) // generation.go
	if err != nil {
		return fmt.Errorf("derive disk key: %w", err)
	}
	defer keys.clear()
	if err := s.recordGeneration(ctx, hello, out); err != nil {
		return err
	}
	grant, err := s.mint(ctx, hello, out)
	if err != nil {
		return err
	}
	ticket := buildTicket(keys.key, grant)
	keys.fill(ticket)
	s.offlineTicket(ctx, snap, hello, out.verified, true, ticket) // offline.go
	out.releaseSlot()                                             // the verifier's work is done; the ack is the agent's
	err = s.handover(ctx, stream, ticket)
	if err != nil && grant != nil {
		s.revoke(ctx, grant.ID, err)
	}
	return err
}

// mint returns nil in disk-only mode and on a rejoin that asked for no
// token (the node still holds its kubelet credentials).
func (s *Service) mint(ctx context.Context, hello *latchkeyv1.Hello, out *outcome) (*token.Grant, error) {
	if s.cfg.Minter == nil || (hello.GetRejoin() && !hello.GetRequestToken()) {
		return nil, nil
	}
	// The approver signs a client certificate only for a CSR made with
	// the token the node's binding records, so the ID is recorded before
	// anyone holds the token: during the mint (overlapping the signature
	// wait) when the minter supports it, else right after. A token that
	// cannot be recorded is taken back.
	var recorded bool
	var recErr error
	record := func(ctx context.Context, id string) error {
		recorded = true
		recErr = s.cfg.Bindings.SetToken(ctx, hello.GetNodeName(), out.verified.MachineID, id)
		return recErr
	}
	g, err := s.cfg.Minter.Mint(ctx, token.Request{
		NodeName:       hello.GetNodeName(),
		Role:           hello.GetRole(),
		EvidenceDigest: out.digest,
		Record:         record,
	})
	if err != nil {
		if recErr != nil {
			return nil, s.recordRefusal(hello, recErr, out)
		}
		return nil, attest.Refuse(mintReason(err), "mint bootstrap token: %w", err)
	}
	out.tokenID = g.ID
	s.cfg.Metrics.TokenMinted()
	if !recorded {
		if err := record(ctx, g.ID); err != nil {
			s.revoke(ctx, g.ID, err)
			return nil, s.recordRefusal(hello, err, out)
		}
	}
	return g, nil
}

// recordRefusal is the refusal of a join whose token ID could not be
// written to the node's binding.
func (s *Service) recordRefusal(hello *latchkeyv1.Hello, err error, out *outcome) error {
	var mm *binding.MismatchError
	if errors.As(err, &mm) {
		out.boundIdentity = mm.Bound
		return attest.Refuse(latchkeyv1.Reason_IDENTITY_MISMATCH, "node %s was rebound while its token was minted", hello.GetNodeName())
	}
	return attest.Refuse(latchkeyv1.Reason_UNAVAILABLE, "record token on node binding: %w", err)
}

func buildTicket(key []byte, g *token.Grant) *latchkeyv1.Ticket {
	t := &latchkeyv1.Ticket{DiskKey: key}
	if g != nil {
		t.ApiServerEndpoints = g.Endpoints
		t.Token = g.Token
		t.CaCertHashes = g.CACertHashes
		t.TokenExpiryUnix = g.Expiry.Unix()
		t.CertificateKey = g.CertificateKey
		t.CaBundle = g.CABundle
	}
	return t
}

// handover sends the ticket and waits, bounded, for the agent's TicketAck.
func (s *Service) handover(ctx context.Context, stream *joinStream, t *latchkeyv1.Ticket) error {
	msg := &latchkeyv1.VerifierMessage{Msg: &latchkeyv1.VerifierMessage_Ticket{Ticket: t}}
	if err := stream.Send(msg); err != nil {
		return fmt.Errorf("%w: send: %v", errNotAcked, err)
	}
	actx, cancel := context.WithTimeout(ctx, s.cfg.AckTimeout)
	defer cancel()
	m, err := recv(actx, stream)
	if err != nil {
		return fmt.Errorf("%w: %v", errNotAcked, err)
	}
	if m.GetTicketAck() == nil {
		return fmt.Errorf("%w: agent sent %T instead", errNotAcked, m.GetMsg())
	}
	return nil
}

// revoke takes back a token whose ticket never reached the agent. It runs
// on a fresh context: the stream's may be what failed.
func (s *Service) revoke(ctx context.Context, id string, cause error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RevokeTimeout)
	defer cancel()
	if err := s.cfg.Minter.Revoke(rctx, id); err != nil {
		s.log.Error("revoke undelivered bootstrap token failed; a live token may be stranded",
			logkey.TokenID, id, logkey.Cause, cause.Error(), logkey.Error, err)
		return
	}
	s.cfg.Metrics.TokenRevoked(metrics.RevokeNoAck)
	s.log.Info("revoked undelivered bootstrap token", logkey.TokenID, id, logkey.Cause, cause.Error())
}

// mintReason: a control-plane token the verifier is not set up to mint is
// a role refusal, a request the token step cannot take is malformed, and
// anything else (the API server, the signer's wait) is transient.
func mintReason(err error) latchkeyv1.Reason {
	switch {
	case errors.Is(err, token.ErrControlPlaneDisabled):
		return latchkeyv1.Reason_ROLE_NOT_ALLOWED
	case errors.Is(err, token.ErrBadRequest):
		return latchkeyv1.Reason_MALFORMED
	}
	return latchkeyv1.Reason_UNAVAILABLE
}
