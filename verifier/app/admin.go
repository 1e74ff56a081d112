package app

import (
	"context"
	"errors"
	"fmt"

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

// tokenAdmin lists and revokes the tokens this cluster's verifiers minted
// (the Secrets labelled managed-by=latchkey).
type tokenAdmin struct {
	client kubernetes.Interface
	minter token.Minter
}

func (t tokenAdmin) List(ctx context.Context) ([]*adminv1.Token, error) {
	l, err := t.client.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{
		LabelSelector: token.ManagedSelector})
	if err != nil {
		return nil, fmt.Errorf("list token secrets: %w", err)
	}
	out := make([]*adminv1.Token, 0, len(l.Items))
	for i := range l.Items {
		if info, ok := token.ReadSecret(&l.Items[i]); ok {
			out = append(out, tokenInfo(info))
		}
	}
	return out, nil
}

// tokenInfo is the admin API's view of a token Secret.
func tokenInfo(i token.Info) *adminv1.Token {
	t := &adminv1.Token{Id: i.ID, NodeName: i.NodeName, EvidenceDigest: i.EvidenceDigest,
		CreatedUnix: i.Created.Unix(), Role: i.Role,
		ExpirationMalformed: i.ExpirationMalformed, RawExpiration: i.RawExpiration}
	if !i.Expiry.IsZero() {
		t.ExpiryUnix = i.Expiry.Unix()
	}
	return t
}

func (t tokenAdmin) Revoke(ctx context.Context, id string) error {
	_, err := t.client.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, token.SecretName(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: %s", adminapi.ErrTokenNotFound, id)
	}
	if err != nil {
		return err
	}
	return t.minter.Revoke(ctx, id)
}

// bindingAdmin lists and releases binding records for the admin API.
type bindingAdmin struct{ store binding.Store }

func (b bindingAdmin) List(ctx context.Context) ([]*adminv1.Binding, error) {
	rs, err := b.store.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]*adminv1.Binding, 0, len(rs))
	for _, r := range rs {
		out = append(out, bindingInfo(r))
	}
	return out, nil
}

func (b bindingAdmin) Release(ctx context.Context, kind adminv1.BindingKind, name, by string) (*adminv1.Binding, error) {
	k := binding.Disk
	if kind == adminv1.BindingKind_BINDING_KIND_NODE {
		k = binding.Node
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
