package ticket

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/internal/logkey"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/protocol"
)

// maxTicketMessage bounds what the agent accepts from a verifier.
const maxTicketMessage = 64 << 10

// diskKeySize is the length of the disk key a ticket must carry.
const diskKeySize = protocol.DiskKeySize

// attempt runs one join on one endpoint.
func (c *Client) attempt(ctx context.Context, endpoint string, req Request) (*latchkeyv1.Ticket, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
	defer cancel()
	tlsCfg, pinErr := recordPinFailure(c.tlsFor(endpoint))
	conn, err := grpc.NewClient("passthrough:///"+endpoint,
		grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		// A retried stream would run on another session; the evidence is
		// bound to the first, so retry here instead.
		grpc.WithDisableRetry(),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxTicketMessage)),
	)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", endpoint, err)
	}
	defer conn.Close()
	stream, err := latchkeyv1.NewJoinServiceClient(conn).Join(ctx, grpc.WaitForReady(false))
	if err == nil {
		var t *latchkeyv1.Ticket
		if t, err = c.exchange(ctx, stream, endpoint, req); err == nil {
			return t, nil
		}
	}
	if perr := pinErr(); perr != nil {
		// gRPC flattens the handshake error into a status string; the
		// recorded error keeps its identity (atls.ErrPinMismatch).
		return nil, fmt.Errorf("%s: %w", endpoint, perr)
	}
	return nil, fromStatus(err)
}

// tlsFor is the TLS configuration for one endpoint: the pins, and the
// verifier name a CA-pinned certificate must be valid for.
func (c *Client) tlsFor(endpoint string) *tls.Config {
	name := c.cfg.ServerName
	if name == "" {
		name, _, _ = net.SplitHostPort(endpoint)
	}
	cfg, err := atls.ClientConfigFor(c.cfg.Pins, c.cfg.InsecureSkipVerifierAuth, name)
	if err != nil { // New already built one from the same pins
		return c.tls
	}
	cfg.ServerName = name
	return cfg
}

// recordPinFailure clones cfg so that a pin check failing inside this
// attempt's handshake is remembered and can be reported as such, not as
// an unreachable verifier.
func recordPinFailure(cfg *tls.Config) (*tls.Config, func() error) {
	cfg = cfg.Clone()
	verify := cfg.VerifyConnection
	if verify == nil {
		return cfg, func() error { return nil }
	}
	var mu sync.Mutex
	var failed error
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		err := verify(cs)
		if err != nil {
			mu.Lock()
			failed = err
			mu.Unlock()
		}
		return err
	}
	return cfg, func() error {
		mu.Lock()
		defer mu.Unlock()
		return failed
	}
}

// exchange makes the bound evidence, sends the Hello, answers challenges
// and acknowledges the ticket.
func (c *Client) exchange(ctx context.Context, stream latchkeyv1.JoinService_JoinClient, endpoint string, req Request) (*latchkeyv1.Ticket, error) {
	hello := &latchkeyv1.Hello{
		NodeName: req.NodeName, DiskUuid: req.DiskUUID, Role: req.Role,
		Rejoin: req.Rejoin, RequestToken: req.RequestToken, Variant: c.cfg.Issuer.Variant(),
	}
	if req.Reattest {
		hello.Purpose = latchkeyv1.Purpose_PURPOSE_REATTEST
	}
	hello.DiskKeyGeneration = req.DiskKeyGeneration
	hello.Offline = req.Offline
	// The verifier's pin was checked during this session's handshake, so
	// no evidence is made for an unauthenticated verifier.
	binding, err := atls.PeerBinding(stream.Context(), hello)
	if err != nil {
		return nil, err
	}
	att, err := c.cfg.Issuer.Attest(ctx, binding)
	if err != nil {
		return nil, fmt.Errorf("make evidence: %w", err)
	}
	defer att.Close()
	hello.Evidence = att.Evidence()
	if err := stream.Send(&latchkeyv1.AgentMessage{Msg: &latchkeyv1.AgentMessage_Hello{Hello: hello}}); err != nil {
		return nil, recvErr(stream, err)
	}
	t, err := receiveTicket(ctx, stream, att, req.Reattest)
	if err == nil && !req.Reattest {
		err = checkGenerations(req, t) // generation.go
	}
	if err != nil {
		return nil, err
	}
	if err := ack(stream); err != nil {
		clear(t.DiskKey)
		clear(t.PreviousDiskKey)
		return nil, err
	}
	c.logReceived(endpoint, hello.Evidence, t)
	return t, nil
}

// logReceived writes the node's half of the audit trail: the fields that
// match the verifier's `join decision` line (evidence digest, token ID),
// never the key or the token secret.
func (c *Client) logReceived(endpoint string, evidence []byte, t *latchkeyv1.Ticket) {
	d := attest.EvidenceDigest(evidence)
	r := Received{Verifier: endpoint, EvidenceDigest: "sha256:" + hex.EncodeToString(d[:]), Variant: c.cfg.Issuer.Variant()}
	attrs := []any{logkey.Endpoint, endpoint, logkey.EvidenceDigest, r.EvidenceDigest}
	if id, _, ok := strings.Cut(t.GetToken(), "."); ok {
		r.TokenID = id
		attrs = append(attrs, logkey.TokenID, id)
	}
	c.cfg.Logger.Info("ticket received", attrs...)
	if c.cfg.OnTicket != nil {
		c.cfg.OnTicket(r)
	}
}

// Received is what the node may keep about a ticket: where it came from
// and the values that match the verifier's audit line, never the key or
// the token secret.
type Received struct {
	Verifier       string
	EvidenceDigest string
	// TokenID is the token's public ID, "" when the ticket had no token.
	TokenID string
	// Variant is the evidence variant the ticket was given for.
	Variant latchkeyv1.Variant
}

func receiveTicket(ctx context.Context, stream latchkeyv1.JoinService_JoinClient, att attest.Attestation, reattest bool) (*latchkeyv1.Ticket, error) {
	for {
		m, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		switch msg := m.GetMsg().(type) {
		case *latchkeyv1.VerifierMessage_Challenge:
			if err := answer(ctx, stream, att, msg.Challenge); err != nil {
				return nil, err
			}
		case *latchkeyv1.VerifierMessage_Ticket:
			if reattest {
				// A re-attestation asks for nothing: a ticket carrying a
				// key or token means a verifier that does not honour the
				// purpose; drop it rather than hold secrets nobody needs.
				// Only the offline grant's renewal or withdrawal may come
				// with it (they carry no secret).
				if !emptyButOffline(msg.Ticket) {
					clear(msg.Ticket.GetDiskKey())
					return nil, errors.New("the verifier answered a re-attestation with a non-empty ticket")
				}
				return msg.Ticket, nil
			}
			if n := len(msg.Ticket.GetDiskKey()); n != diskKeySize {
				return nil, fmt.Errorf("ticket disk key is %d bytes, want %d", n, diskKeySize)
			}
			return msg.Ticket, nil
		default:
			return nil, fmt.Errorf("unexpected verifier message %T", m.GetMsg())
		}
	}
}

// emptyButOffline reports whether t carries nothing but its offline
// fields (the copy's keys, if any, are cleared).
func emptyButOffline(t *latchkeyv1.Ticket) bool {
	c := proto.Clone(t).(*latchkeyv1.Ticket)
	defer clear(c.GetDiskKey())
	defer clear(c.GetPreviousDiskKey())
	c.OfflineGrant, c.WithdrawOffline = nil, false
	return proto.Equal(c, &latchkeyv1.Ticket{})
}

func answer(ctx context.Context, stream latchkeyv1.JoinService_JoinClient, att attest.Attestation, ch *latchkeyv1.Challenge) error {
	resp, err := att.Respond(ctx, ch.GetPayload())
	if err != nil {
		return fmt.Errorf("answer challenge: %w", err)
	}
	msg := &latchkeyv1.AgentMessage{Msg: &latchkeyv1.AgentMessage_ChallengeResponse{
		ChallengeResponse: &latchkeyv1.ChallengeResponse{Payload: resp}}}
	if err := stream.Send(msg); err != nil {
		return recvErr(stream, err)
	}
	return nil
}

// ack hands the ticket over: the verifier revokes the token without it.
// The stream's clean end confirms the verifier saw the ack.
func ack(stream latchkeyv1.JoinService_JoinClient) error {
	if err := stream.Send(&latchkeyv1.AgentMessage{Msg: &latchkeyv1.AgentMessage_TicketAck{TicketAck: &latchkeyv1.TicketAck{}}}); err != nil {
		return recvErr(stream, err)
	}
	if err := stream.CloseSend(); err != nil {
		return err
	}
	if _, err := stream.Recv(); err != nil && !isEOF(err) {
		return fmt.Errorf("ticket handover: %w", err)
	}
	return nil
}

// recvErr returns the stream's status: a failed Send hides the real cause
// (io.EOF), which the next Recv reports.
func recvErr(stream latchkeyv1.JoinService_JoinClient, sendErr error) error {
	if _, err := stream.Recv(); err != nil && !isEOF(err) {
		return err
	}
	return sendErr
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }
