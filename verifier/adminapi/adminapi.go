// Package adminapi is the verifier's admin service (latchkey.admin.v1
// VerifierAdmin), served on the admin socket by internal/localapi: list and
// revoke bootstrap tokens, check a policy without loading it. It takes
// small interfaces (Tokens, PolicyChecker) the verifier implements, and
// prints the token table `latchkey-verifier tokens list` shows.
package adminapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/latchkey/latchkey/internal/localapi"
	"github.com/latchkey/latchkey/internal/logkey"
	"github.com/latchkey/latchkey/internal/peercred"
	adminv1 "github.com/latchkey/latchkey/proto/latchkey/admin/v1"
)

// MaxPolicySize bounds the policy a CheckPolicy call may carry.
const MaxPolicySize = 1 << 20

// The server must accept a policy of MaxPolicySize with its framing.
var _ = [localapi.MaxRequestSize - MaxPolicySize - 4096]struct{}{}

// Tokens lists and revokes the bootstrap tokens a verifier minted.
type Tokens interface {
	// List returns the tokens, and the binding records it had to leave
	// out because they could not be read (binding.SkippedError).
	List(ctx context.Context) ([]*adminv1.Token, []*adminv1.SkippedRecord, error)
	// Revoke deletes the token; it returns an error wrapping
	// ErrTokenNotFound when no such token exists (a message
	// "token not found: WHY" gives the caller the why).
	Revoke(ctx context.Context, id string) error
}

// ErrTokenNotFound is what Tokens.Revoke wraps for an unknown token ID; the
// API answers NOT_FOUND.
var ErrTokenNotFound = errors.New("token not found")

// PolicyChecker validates a policy file's contents without loading it. It
// returns the digest the policy would have once loaded, or why it is
// invalid.
type PolicyChecker interface {
	Check(ctx context.Context, policy []byte) (digest string, err error)
}

// Bindings lists and releases the verifier's binding records. by, given
// to Release, names the caller for the store's audit line.
type Bindings interface {
	// List returns the records it could read, and the ones it left out.
	List(ctx context.Context) ([]*adminv1.Binding, []*adminv1.SkippedRecord, error)
	// Release returns what the record held; an error wrapping
	// ErrBindingNotFound when the name is not bound, ErrBadBinding when
	// the name is not one.
	Release(ctx context.Context, kind adminv1.BindingKind, name, by string) (*adminv1.Binding, error)
}

// Errors Bindings.Release wraps; the API answers NOT_FOUND,
// INVALID_ARGUMENT and FAILED_PRECONDITION.
var (
	ErrBindingNotFound = errors.New("binding not found")
	ErrBadBinding      = errors.New("not a node name or disk uuid")
	// ErrBindingDenied: the name is on the deny list, which denies the
	// machine bound to it; releasing it would readmit that machine.
	ErrBindingDenied = errors.New("binding denied")
)

// Service is the VerifierAdmin service. tokens is nil in disk-only mode
// (token calls answer FAILED_PRECONDITION); policies nil answers
// CheckPolicy with UNIMPLEMENTED; bindings nil answers the binding calls
// with UNIMPLEMENTED.
func Service(tokens Tokens, policies PolicyChecker, bindings Bindings) localapi.Service {
	return func(s *grpc.Server, log *slog.Logger) {
		adminv1.RegisterVerifierAdminServer(s, &verifierServer{tokens: tokens, policies: policies, bindings: bindings, log: log})
	}
}

// tokenID is the kubeadm bootstrap token ID syntax.
var tokenID = regexp.MustCompile(`^[a-z0-9]{6}$`)

type verifierServer struct {
	adminv1.UnimplementedVerifierAdminServer
	tokens   Tokens
	policies PolicyChecker
	bindings Bindings
	log      *slog.Logger
}

var errDiskOnly = status.Error(codes.FailedPrecondition,
	"this verifier mints no tokens (disk-only mode: no Kubernetes configured)")

func (v *verifierServer) ListTokens(ctx context.Context, _ *adminv1.ListTokensRequest) (*adminv1.ListTokensResponse, error) {
	if v.tokens == nil {
		return nil, errDiskOnly
	}
	ts, skipped, err := v.tokens.List(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "list tokens: %v", err)
	}
	return &adminv1.ListTokensResponse{Tokens: ts, Skipped: skipped}, nil
}

func (v *verifierServer) RevokeToken(ctx context.Context, req *adminv1.RevokeTokenRequest) (*adminv1.RevokeTokenResponse, error) {
	if v.tokens == nil {
		return nil, errDiskOnly
	}
	if !tokenID.MatchString(req.GetId()) {
		return nil, status.Error(codes.InvalidArgument, "token ID must be 6 characters [a-z0-9]")
	}
	err := v.tokens.Revoke(ctx, req.GetId())
	switch {
	case errors.Is(err, ErrTokenNotFound):
		msg := "no bootstrap token " + req.GetId()
		if why, ok := strings.CutPrefix(err.Error(), ErrTokenNotFound.Error()+": "); ok {
			msg += ": " + why
		}
		return nil, status.Error(codes.NotFound, msg)
	case err != nil:
		return nil, status.Errorf(codes.Unavailable, "revoke token %s: %v", req.GetId(), err)
	}
	c, _ := peercred.FromContext(ctx)
	v.log.InfoContext(ctx, "bootstrap token revoked by admin", logkey.TokenID, req.GetId(), logkey.UID, c.UID, logkey.PID, c.PID)
	return &adminv1.RevokeTokenResponse{}, nil
}

func (v *verifierServer) CheckPolicy(ctx context.Context, req *adminv1.CheckPolicyRequest) (*adminv1.CheckPolicyResponse, error) {
	if v.policies == nil {
		return nil, status.Error(codes.Unimplemented, "this server checks no policies")
	}
	if n := len(req.GetPolicy()); n == 0 || n > MaxPolicySize {
		return nil, status.Errorf(codes.InvalidArgument, "policy is %d bytes, want 1 to %d", n, MaxPolicySize)
	}
	digest, err := v.policies.Check(ctx, req.GetPolicy())
	if err != nil {
		return &adminv1.CheckPolicyResponse{Valid: false, Error: err.Error()}, nil
	}
	return &adminv1.CheckPolicyResponse{Valid: true, Digest: digest}, nil
}

func (v *verifierServer) ListBindings(ctx context.Context, _ *adminv1.ListBindingsRequest) (*adminv1.ListBindingsResponse, error) {
	if v.bindings == nil {
		return nil, status.Error(codes.Unimplemented, "this server keeps no bindings")
	}
	bs, skipped, err := v.bindings.List(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "list bindings: %v", err)
	}
	return &adminv1.ListBindingsResponse{Bindings: bs, Skipped: skipped}, nil
}

// ReleaseBinding releases one record and writes the audit line: who (the
// peer's uid and pid) released what, and the identity it held.
func (v *verifierServer) ReleaseBinding(ctx context.Context, req *adminv1.ReleaseBindingRequest) (*adminv1.ReleaseBindingResponse, error) {
	if v.bindings == nil {
		return nil, status.Error(codes.Unimplemented, "this server keeps no bindings")
	}
	if k := req.GetKind(); k != adminv1.BindingKind_BINDING_KIND_NODE && k != adminv1.BindingKind_BINDING_KIND_DISK {
		return nil, status.Error(codes.InvalidArgument, "kind must be node or disk")
	}
	c, _ := peercred.FromContext(ctx)
	by := fmt.Sprintf("admin uid=%d pid=%d", c.UID, c.PID)
	b, err := v.bindings.Release(ctx, req.GetKind(), req.GetName(), by)
	switch {
	case errors.Is(err, ErrBadBinding):
		return nil, status.Errorf(codes.InvalidArgument, "%v", err)
	case errors.Is(err, ErrBindingNotFound):
		return nil, status.Errorf(codes.NotFound, "%v", err)
	case errors.Is(err, ErrBindingDenied):
		return nil, status.Errorf(codes.FailedPrecondition, "%v", err)
	case err != nil:
		return nil, status.Errorf(codes.Unavailable, "release binding: %v", err)
	}
	v.log.WarnContext(ctx, "binding released by admin", logkey.Kind, kindName(req.GetKind()), logkey.Name, req.GetName(),
		logkey.Identity, b.GetIdentity(), logkey.TokenID, b.GetTokenId(), logkey.UID, c.UID, logkey.PID, c.PID)
	return &adminv1.ReleaseBindingResponse{Released: b}, nil
}
