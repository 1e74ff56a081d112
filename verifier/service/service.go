// Package service is the verifier's JoinService: it reads a Hello, checks
// the evidence against the policy in force, checks that the disk UUID and
// node name belong to the attested machine (verifier/binding), derives
// the disk key, mints a bootstrap token when the node needs one, records
// the token on the node's binding, and hands the ticket over.
//
// Every join that sent a Hello and was admitted ends in exactly one audit
// line (node, disk, role, request_token, variant, evidence digest, result,
// reason) and, when refused, a gRPC status carrying a latchkeyv1.Refusal
// with the same reason. Joins refused at admission (admission.go) and
// streams that end before a Hello are counted in metrics instead
// (honest.go): a flood of either costs no log volume. No key is released and no token
// is left behind on any failure: a token minted for a ticket the agent never
// acknowledged is revoked.
package service

import (
	"context"
	"encoding/hex"
	"errors"
	"log/slog"
	"time"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/atls"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/keys"
	"github.com/latchkey/latchkey/verifier/metrics"
	"github.com/latchkey/latchkey/verifier/policy"
	"github.com/latchkey/latchkey/verifier/token"
)

// Limits on what one join may send; larger input is refused as MALFORMED.
const (
	// MaxMessageSize is the gRPC receive limit of the join service: the
	// largest evidence plus 8 KiB for the Hello's other fields (node name,
	// disk UUID: well under 1 KiB) and framing.
	MaxMessageSize = MaxEvidenceSize + 8<<10
	// MaxEvidenceSize bounds Hello.evidence (attest.MaxEvidenceSize,
	// 256 KiB: TPM evidence with event logs is at most 208 KiB).
	MaxEvidenceSize = attest.MaxEvidenceSize
	// MaxChallenges bounds the challenge round trips of one join.
	MaxChallenges = 4
)

// DefaultChallengeTimeout bounds the wait for one challenge answer when
// none is configured: TPM2_ActivateCredential takes well under a second
// even on a slow TPM, and a client that cannot answer (no TPM behind its
// "AK") must not hold a stream for the whole join timeout.
const DefaultChallengeTimeout = 5 * time.Second

// DefaultJoinTimeout bounds a whole join when none is configured.
const DefaultJoinTimeout = 60 * time.Second

// Config holds the service's dependencies.
type Config struct {
	Policy policy.Source
	Keys   *keys.Deriver
	// Minter mints bootstrap tokens; nil is disk-only mode.
	Minter token.Minter
	// Bindings records which machine identity owns each disk UUID and
	// (with a Minter) node name; required.
	Bindings binding.Store
	// AdoptUnbound lets a rejoin whose disk UUID or node name has no
	// binding record claim it (the upgrade from a verifier without
	// identity binding). Off, such a rejoin is refused.
	AdoptUnbound bool
	Logger       *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// JoinTimeout bounds a whole join, challenges included (default 60s).
	JoinTimeout time.Duration
	// ChallengeTimeout bounds each wait for a challenge answer (default
	// DefaultChallengeTimeout); the wait holds no admission slot while a
	// challenge-wait place is free (admission.go).
	ChallengeTimeout time.Duration
	// AckTimeout bounds the wait for TicketAck (default 10s).
	AckTimeout time.Duration
	// RevokeTimeout bounds revoking an undelivered token (default 10s).
	RevokeTimeout time.Duration
	// Metrics records joins and tokens; nil records nothing.
	Metrics *metrics.Metrics
	// Revoker, when set, deletes a denied node's token on its refused
	// join, counting each token once with its sweeps (revoked.go).
	Revoker *Revoker
	// MaxInFlight bounds the joins between Hello and ticket at once; more are
	// answered with RESOURCE_EXHAUSTED and a retry-after hint (default
	// DefaultMaxInFlight; see admission.go).
	MaxInFlight int
	// PolicyNext is the candidate policy (`policyNext`), evaluated next to
	// the enforced one for the audit line and a metric only (shadow.go);
	// nil evaluates none.
	PolicyNext policy.Source
	// Grants signs offline grants (offline.go); nil issues none, even
	// where the policy allows offline unlock.
	Grants GrantSigner
}

// Service implements latchkeyv1.JoinServiceServer.
type Service struct {
	latchkeyv1.UnimplementedJoinServiceServer
	cfg Config
	log *slog.Logger
	adm *admission
}

// New checks cfg and fills defaults.
func New(cfg Config) (*Service, error) {
	if cfg.Policy == nil {
		return nil, errors.New("service: no policy source")
	}
	if cfg.Keys == nil {
		return nil, errors.New("service: no key deriver")
	}
	if cfg.Bindings == nil {
		return nil, errors.New("service: no binding store")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.JoinTimeout = orDefault(cfg.JoinTimeout, DefaultJoinTimeout)
	cfg.ChallengeTimeout = orDefault(cfg.ChallengeTimeout, DefaultChallengeTimeout)
	cfg.AckTimeout = orDefault(cfg.AckTimeout, 10*time.Second)
	cfg.RevokeTimeout = orDefault(cfg.RevokeTimeout, 10*time.Second)
	return &Service{cfg: cfg, log: cfg.Logger, adm: newAdmission(cfg.MaxInFlight, cfg.Now)}, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// outcome collects what the audit line reports about one join.
type outcome struct {
	hello      *latchkeyv1.Hello
	verified   *attest.Verified
	digest     string
	result     string
	validation time.Duration
	tokenID    string
	// boundIdentity is the identity on record when a binding refused.
	boundIdentity string
	// adopted names the kinds of record this rejoin adopted.
	adopted []string
	// revoked is the deny-list entry that refused the join.
	revoked string
	// slot is the join's admission slot (admission.go), nil while it
	// holds none (before admission, during a challenge wait, after its
	// release).
	slot *joinSlot
	// admitted: the join passed admission once (a later refusal for want
	// of a slot, after a challenge wait, is audited like any other).
	admitted bool
	// shadowDecision, shadowReason and shadowPolicy: the candidate
	// policy's verdict (shadow.go); empty without one.
	shadowDecision, shadowReason, shadowPolicy string
	// generationRecorded: the disk's claim recorded its key generation
	// (generation.go).
	generationRecorded bool
	// bound: the node and disk are bound to the verified machine (the
	// join's bind or the re-attestation's checkBound passed).
	bound bool
}

// Join runs one join attempt on the stream.
func (s *Service) Join(stream latchkeyv1.JoinService_JoinServer) error {
	ctx, cancel := context.WithTimeout(stream.Context(), s.cfg.JoinTimeout)
	defer cancel()
	snap := s.cfg.Policy.Current()
	out := &outcome{}
	err := s.join(ctx, newJoinStream(stream), snap, out)
	s.record(ctx, snap, out, err)
	if err != nil {
		return toStatus(err)
	}
	return nil
}

func (s *Service) join(ctx context.Context, stream *joinStream, snap *policy.Snapshot, out *outcome) error {
	hello, err := recvHello(ctx, stream)
	if err != nil {
		out.hello = auditableHello(hello)
		return err
	}
	out.hello = hello
	slot, err := s.admit(stream.Context(), 0)
	if err != nil {
		return err
	}
	out.slot, out.admitted = slot, true
	defer out.releaseSlot()
	if len(hello.GetEvidence()) > 0 {
		d := attest.EvidenceDigest(hello.GetEvidence())
		out.digest = "sha256:" + hex.EncodeToString(d[:])
	}
	if hello.GetPurpose() == latchkeyv1.Purpose_PURPOSE_REATTEST {
		return s.reattest(ctx, stream, snap, hello, out)
	}
	v, err := s.validate(ctx, stream, snap, hello, out)
	if err != nil {
		return err
	}
	out.verified = v
	if err := s.checkRevoked(ctx, snap, hello, v, out); err != nil {
		return err
	}
	s.evalShadow(hello.GetVariant(), v, out)
	if err := checkRole(snap, hello); err != nil {
		return err
	}
	// Every check that can refuse (policy in validate, deny list, role,
	// generation) runs before bind claims anything: a refused join leaves
	// no trace in the binding store.
	if err := s.checkGeneration(hello); err != nil {
		return err
	}
	if err := s.bind(ctx, hello, v, out); err != nil {
		return err
	}
	out.bound = true
	return s.issue(ctx, stream, snap, hello, out)
}

// validate binds the Hello to this TLS session and runs the variant's
// validator whole (attest.Validate: Verify, then CheckPolicy on the state
// it returned), with challenges carried over the stream.
func (s *Service) validate(ctx context.Context, stream *joinStream, snap *policy.Snapshot, hello *latchkeyv1.Hello, out *outcome) (*attest.Verified, error) {
	val, ok := snap.Validators[hello.GetVariant()]
	if !ok {
		return nil, attest.Refuse(latchkeyv1.Reason_UNKNOWN_VARIANT, "variant %s is not enabled by the policy", hello.GetVariant())
	}
	binding, err := atls.PeerBinding(stream.Context(), hello)
	if err != nil {
		return nil, err
	}
	start := s.cfg.Now()
	v, err := attest.Validate(ctx, val, hello.GetEvidence(), binding, s.challenger(stream, out))
	out.validation = s.cfg.Now().Sub(start)
	s.cfg.Metrics.ObserveValidation(hello.GetVariant(), out.validation)
	if err != nil {
		return nil, err
	}
	return v, nil
}

func checkRole(snap *policy.Snapshot, hello *latchkeyv1.Hello) error {
	if hello.GetRole() == latchkeyv1.Role_ROLE_CONTROL_PLANE && !snap.ControlPlane[hello.GetVariant()] {
		return attest.Refuse(latchkeyv1.Reason_ROLE_NOT_ALLOWED, "the policy does not allow %s evidence to join as control plane", hello.GetVariant())
	}
	return nil
}
