package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	adminv1 "github.com/latchkey/latchkey/proto/latchkey/admin/v1"
	"github.com/latchkey/latchkey/verifier/adminapi"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/policy"
	"github.com/latchkey/latchkey/verifier/token"
)

// policyChecker validates a policy's bytes without installing it.
type policyChecker struct{ deps policy.Deps }

func (p policyChecker) Check(_ context.Context, data []byte) (string, error) {
	snap, err := policy.Load(data, p.deps)
	if err != nil {
		return "", err
	}
	return snap.Digest, nil
}

// tokenAdmin lists and revokes the tokens this cluster's verifiers minted,
// with the verifier's own narrow credential (verifier/deploy), which may
// not read any Secret: the tokens are the ones the node binding Leases
// record (each node's latest), and whether each still exists is asked
// with a dry-run delete of its Secret (the one Secret verb the verifier
// holds; nothing is deleted and no Secret data is read). A record naming
// a token that is gone (reaped before the reaper cleared records, or a
// failed mint) is cleared on the way. A node's earlier token was deleted
// when its record got the next (binding.LeaseConfig.OnTokenReplaced). A
// token latchkey did not mint is not listed, and revoking it is refused:
// the verifier deletes only its own tokens.
type tokenAdmin struct {
	client   kubernetes.Interface
	minter   token.Minter
	bindings binding.Store
}

// probeWorkers bounds the concurrent existence checks of one List.
const probeWorkers = 16

func (t tokenAdmin) List(ctx context.Context) ([]*adminv1.Token, []*adminv1.SkippedRecord, error) {
	recs, skipped, err := t.tokenRecords(ctx)
	if err != nil {
		return nil, nil, err
	}
	live := make([]bool, len(recs))
	errs := make([]error, len(recs))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(probeWorkers, len(recs)) {
		wg.Go(func() {
			for i := range next {
				live[i], errs[i] = t.exists(ctx, recs[i].TokenID)
				if !live[i] && errs[i] == nil {
					t.forget(ctx, recs[i])
				}
			}
		})
	}
	for i := range recs {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}
	out := make([]*adminv1.Token, 0, len(recs))
	for i, r := range recs {
		if live[i] {
			out = append(out, tokenInfo(r))
		}
	}
	return out, skippedInfo(skipped), nil
}

// tokenRecords are the bound node records that name a token, and the
// records the listing skipped (unreadable: they are left out, so one bad
// record does not stop every token from being listed or revoked).
func (t tokenAdmin) tokenRecords(ctx context.Context) ([]binding.Record, []binding.SkippedRecord, error) {
	if t.bindings == nil {
		return nil, nil, errors.New("no binding store")
	}
	all, err := t.bindings.List(ctx)
	skipped, err := binding.Skipped(err)
	if err != nil {
		return nil, nil, err
	}
	var out []binding.Record
	for _, r := range all {
		if r.Kind == binding.Node && r.Bound() && r.TokenID != "" {
			out = append(out, r)
		}
	}
	return out, skipped, nil
}

// skippedInfo is the admin API's view of skipped records.
func skippedInfo(s []binding.SkippedRecord) []*adminv1.SkippedRecord {
	out := make([]*adminv1.SkippedRecord, 0, len(s))
	for _, r := range s {
		out = append(out, &adminv1.SkippedRecord{Key: r.Key, Reason: r.Reason})
	}
	return out
}

// exists asks whether the token's Secret exists with a dry-run delete.
func (t tokenAdmin) exists(ctx context.Context, id string) (bool, error) {
	err := t.client.CoreV1().Secrets(metav1.NamespaceSystem).Delete(ctx, token.SecretName(id),
		metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	default:
		return false, fmt.Errorf("check token %s: %w", id, err)
	}
}

// tokenInfo is the admin API's view of a token a node record names.
func tokenInfo(r binding.Record) *adminv1.Token {
	t := &adminv1.Token{Id: r.TokenID, NodeName: r.Name}
	if !r.TokenRecorded.IsZero() {
		t.CreatedUnix = r.TokenRecorded.Unix()
	}
	if !r.TokenExpiry.IsZero() {
		t.ExpiryUnix = r.TokenExpiry.Unix()
	}
	return t
}

// forget clears a gone token from its node's record (best effort: the
// next list asks again), so records written before the reaper cleared
// them, or whose clearing failed, cost one existence check, not one per
// list.
func (t tokenAdmin) forget(ctx context.Context, r binding.Record) {
	if c, ok := t.bindings.(tokenClearer); ok {
		_ = c.ClearToken(ctx, r.Name, r.TokenID)
	}
}

// tokenClearer removes a revoked token from its node's record
// (binding.Leases).
type tokenClearer interface {
	ClearToken(ctx context.Context, node, tokenID string) error
}

// Revoke deletes a token a node record names, and clears it from the
// record so the CSR approver refuses a CSR made with it before. An ID no
// record names (a token latchkey did not mint, a typo) or whose Secret is
// gone wraps ErrTokenNotFound; nothing is deleted then.
func (t tokenAdmin) Revoke(ctx context.Context, id string) error {
	recs, skipped, err := t.tokenRecords(ctx)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(recs, func(r binding.Record) bool { return r.TokenID == id })
	if i < 0 {
		why := ""
		if len(skipped) > 0 {
			// The token may be named by a record that cannot be read.
			why = fmt.Sprintf("; %d unreadable binding record(s) were skipped (`bindings list` names them)", len(skipped))
		}
		return fmt.Errorf("%w: not the token of any node this cluster's verifiers bound (latchkey deletes only its own)%s",
			adminapi.ErrTokenNotFound, why)
	}
	live, err := t.exists(ctx, id)
	if err != nil {
		return err
	}
	if !live {
		return fmt.Errorf("%w: node %s's token, already gone (used, revoked or expired)", adminapi.ErrTokenNotFound, recs[i].Name)
	}
	if err := t.minter.Revoke(ctx, id); err != nil {
		return err
	}
	if c, ok := t.bindings.(tokenClearer); ok {
		if err := c.ClearToken(ctx, recs[i].Name, id); err != nil {
			return fmt.Errorf("token %s deleted, but not cleared from node %s's record: %w", id, recs[i].Name, err)
		}
	}
	return nil
}

// bindingAdmin lists and releases binding records for the admin API.
// A name the deny list in force names (deny.nodeNames, deny.diskUUIDs) is
// not released: the entry denies the machine bound to it, and releasing
// the name would let that machine back in under a fresh name.
type bindingAdmin struct {
	store  binding.Store
	policy policy.Source
}

func (b bindingAdmin) List(ctx context.Context) ([]*adminv1.Binding, []*adminv1.SkippedRecord, error) {
	rs, err := b.store.List(ctx)
	skipped, err := binding.Skipped(err)
	if err != nil {
		return nil, nil, err
	}
	out := make([]*adminv1.Binding, 0, len(rs))
	for _, r := range rs {
		out = append(out, bindingInfo(r))
	}
	return out, skippedInfo(skipped), nil
}

func (b bindingAdmin) Release(ctx context.Context, kind adminv1.BindingKind, name, by string) (*adminv1.Binding, error) {
	k := binding.Disk
	if kind == adminv1.BindingKind_BINDING_KIND_NODE {
		k = binding.Node
	}
	if b.policy != nil {
		deny := b.policy.Current().Deny
		if (k == binding.Node && deny.DeniesNode(name)) || (k == binding.Disk && deny.DeniesDisk(name)) {
			return nil, fmt.Errorf("%w: %s %s is on the policy's deny list, which denies the machine bound to it; "+
				"remove the entry first", adminapi.ErrBindingDenied, k, name)
		}
	}
	r, err := b.store.Release(ctx, k, name, by)
	switch {
	case errors.Is(err, binding.ErrNotFound):
		return nil, fmt.Errorf("%w: %v", adminapi.ErrBindingNotFound, err)
	case errors.Is(err, binding.ErrInvalid):
		return nil, fmt.Errorf("%w: %v", adminapi.ErrBadBinding, err)
	case err != nil:
		return nil, err
	}
	return bindingInfo(r), nil
}

func bindingInfo(r binding.Record) *adminv1.Binding {
	b := &adminv1.Binding{Kind: adminv1.BindingKind_BINDING_KIND_DISK, Name: r.Name, Identity: r.Identity,
		TokenId: r.TokenID, ReleasedBy: r.ReleasedBy}
	if r.Kind == binding.Node {
		b.Kind = adminv1.BindingKind_BINDING_KIND_NODE
	}
	if !r.Created.IsZero() {
		b.CreatedUnix = r.Created.Unix()
	}
	if !r.Released.IsZero() {
		b.ReleasedUnix = r.Released.Unix()
	}
	b.KeyGeneration = r.KeyGeneration // secrets.go, `secret retire`
	return b
}
