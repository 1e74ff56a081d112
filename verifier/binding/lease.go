package binding

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/latchkey/latchkey/internal/boundedmap"
	"github.com/latchkey/latchkey/internal/kubekey"
	"github.com/latchkey/latchkey/internal/logkey"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/util/retry"
)

// DefaultNamespace is latchkey's own namespace for binding Leases.
const DefaultNamespace = "latchkey-system"

// The labels and annotations of a binding Lease are internal/kubekey's:
// LabelBinding says the kind, AnnotationNodeName or AnnotationDiskUUID
// the name (AnnotationLegacyName on records older verifiers wrote),
// AnnotationIdentity the bound machine, and the token, release and
// generation annotations what happened to it since.

// LeaseConfig configures a Lease store.
type LeaseConfig struct {
	Client kubernetes.Interface
	// Namespace holds the Leases (default DefaultNamespace); it must exist
	// (verifier/deploy creates latchkey-system).
	Namespace string
	Logger    *slog.Logger
	// TokenTTL is the minter's token lifetime: SetToken records the
	// token's expiry as the time of recording plus TokenTTL (later than
	// the Secret's own by at most the Secret write's latency). Zero
	// records no expiry.
	TokenTTL time.Duration
	// OnTokenReplaced, when set, is called after SetToken replaced another
	// token ID on a node's record (the node asked again before its
	// previous join finished). The CSR approver honours only the recorded
	// token, so the verifier deletes the replaced one: every live latchkey
	// token stays named by a record (`tokens list`).
	OnTokenReplaced func(ctx context.Context, node, previousID string)
}

// Leases keeps records as coordination.k8s.io Leases named ObjectName
// ("node-<name>", "disk-<uuid>"). A claim is a Create, which the API
// server refuses with AlreadyExists when the Lease exists; the claimer
// then reads it and compares, so every replica reaches the same verdict.
// Token updates are optimistic (resourceVersion), so a record released
// and reclaimed meanwhile is never overwritten.
//
// The node Lease is also the per-node record continuous re-attestation
// keeps: it may add its own latchkey.io/ annotations (time,
// evidence digest, decision) and renew spec.renewTime, with the same
// optimistic updates. Only Claim and Release write the identity
// annotations and spec.holderIdentity.
type Leases struct {
	client kubernetes.Interface
	ns     string
	log    *slog.Logger
	ttl    time.Duration
	// replaced is LeaseConfig.OnTokenReplaced.
	replaced func(ctx context.Context, node, previousID string)
	// copies is each Lease as this replica last wrote it, by name: the
	// next optimistic update of a record it just wrote (a join's token
	// after its claim, the reaper's clearing, the next re-attestation
	// round) starts from it and skips its read. A stale copy costs one
	// refused write (the resourceVersion precondition), then a fresh read;
	// a copy only ever lets a write through, and every decision not to
	// write is taken again on a fresh read.
	copies *boundedmap.Map[string, *coordinationv1.Lease]
}

// maxLeaseCopies bounds the Leases a store remembers (about 2 KB each);
// a forgotten one costs that record's next update a read.
const maxLeaseCopies = 8192

var _ Store = (*Leases)(nil)

// NewLeases checks cfg.
func NewLeases(cfg LeaseConfig) (*Leases, error) {
	if cfg.Client == nil {
		return nil, errors.New("binding: no Kubernetes client")
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if errs := validation.IsDNS1123Label(cfg.Namespace); len(errs) > 0 {
		return nil, fmt.Errorf("binding: namespace %q: %v", cfg.Namespace, errs)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.TokenTTL < 0 {
		return nil, errors.New("binding: negative token TTL")
	}
	return &Leases{client: cfg.Client, ns: cfg.Namespace, log: cfg.Logger.With(logkey.Component, "binding"),
		ttl: cfg.TokenTTL, replaced: cfg.OnTokenReplaced,
		copies: boundedmap.New[string, *coordinationv1.Lease](maxLeaseCopies)}, nil
}

// Claim implements Store.
func (l *Leases) Claim(ctx context.Context, kind Kind, name, identity string) (Record, error) {
	r, _, err := l.claim(ctx, kind, name, identity, nil)
	return r, err
}

// claim is Claim, recording gen (when non-nil) on a Lease it creates or
// takes over; made reports it did either.
func (l *Leases) claim(ctx context.Context, kind Kind, name, identity string, gen *uint32) (Record, bool, error) {
	if err := validate(kind, name, identity, true); err != nil {
		return Record{}, false, err
	}
	holder := identity
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:        ObjectName(kind, name),
			Namespace:   l.ns,
			Labels:      map[string]string{kubekey.LabelManagedBy: kubekey.ManagedBy, kubekey.LabelBinding: string(kind)},
			Annotations: map[string]string{nameKeys[kind]: name, kubekey.AnnotationIdentity: identity},
		},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder},
	}
	if gen != nil {
		lease.Annotations[kubekey.AnnotationKeyGeneration] = strconv.FormatUint(uint64(*gen), 10)
	}
	created, err := l.leases().Create(ctx, lease, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		var have Record
		created, have, err = l.takeOver(ctx, kind, name, identity, gen)
		if err != nil {
			return Record{}, false, err
		}
		if created == nil { // bound already
			return have, false, Check(have, identity)
		}
	} else if err != nil {
		return Record{}, false, fmt.Errorf("binding: create lease %s/%s: %w", l.ns, lease.Name, err)
	}
	l.log.Info("binding claimed", logkey.Kind, string(kind), logkey.Name, name, logkey.Identity, identity)
	r, err := record(created)
	if err == nil {
		l.keep(created) // after the last read of it here: an update may take it at once
	}
	return r, err == nil, err
}

// takeOver binds a released Lease to identity, conditioned on the
// version read, so two racing claims of one released record cannot both
// win: the loser's update conflicts, and on its retry it finds the
// record bound. When the record is bound it returns no Lease and the
// record it read.
func (l *Leases) takeOver(ctx context.Context, kind Kind, name, identity string, gen *uint32) (*coordinationv1.Lease, Record, error) {
	obj := ObjectName(kind, name)
	var out *coordinationv1.Lease
	var have Record
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		out = nil
		lease, err := l.leases().Get(ctx, obj, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("binding: get lease %s/%s: %w", l.ns, obj, err)
		}
		r, err := record(lease)
		if err != nil {
			return err
		}
		if r.Kind != kind || r.Name != name {
			return fmt.Errorf("binding: lease %s/%s records %s %q", l.ns, obj, r.Kind, r.Name)
		}
		if r.Bound() {
			have = r
			return nil
		}
		holder := identity
		lease.Annotations[kubekey.AnnotationIdentity] = identity
		delete(lease.Annotations, kubekey.AnnotationReleasedAt)
		delete(lease.Annotations, kubekey.AnnotationReleasedBy)
		if gen != nil {
			lease.Annotations[kubekey.AnnotationKeyGeneration] = strconv.FormatUint(uint64(*gen), 10)
		}
		lease.Spec.HolderIdentity = &holder
		now := metav1.NewMicroTime(time.Now())
		lease.Spec.AcquireTime = &now
		out, err = l.leases().Update(ctx, lease, metav1.UpdateOptions{})
		if err != nil && !apierrors.IsConflict(err) {
			return fmt.Errorf("binding: update lease %s/%s: %w", l.ns, obj, err)
		}
		return err
	})
	return out, have, err
}

// Get implements Store.
func (l *Leases) Get(ctx context.Context, kind Kind, name string) (Record, error) {
	if err := validate(kind, name, "", false); err != nil {
		return Record{}, err
	}
	lease, err := l.leases().Get(ctx, ObjectName(kind, name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return Record{}, fmt.Errorf("%w: %s %s", ErrNotFound, kind, name)
	}
	if err != nil {
		return Record{}, fmt.Errorf("binding: get lease %s/%s: %w", l.ns, ObjectName(kind, name), err)
	}
	r, err := record(lease)
	if err != nil {
		return Record{}, err
	}
	if r.Kind != kind || r.Name != name {
		return Record{}, fmt.Errorf("binding: lease %s/%s records %s %q", l.ns, lease.Name, r.Kind, r.Name)
	}
	return r, nil
}

// SetToken implements Store. It retries on conflicts (another replica
// recorded another token for the same identity), re-checking the
// identity each time.
func (l *Leases) SetToken(ctx context.Context, node, identity, tokenID string) error {
	if err := validate(Node, node, identity, true); err != nil {
		return err
	}
	var previous string
	err := l.updateBoundNode(ctx, node, identity, func(lease *coordinationv1.Lease) {
		previous = lease.Annotations[kubekey.AnnotationTokenID]
		lease.Annotations[kubekey.AnnotationTokenID] = tokenID
		at := time.Now()
		lease.Annotations[kubekey.AnnotationTokenRecordedAt] = at.UTC().Format(time.RFC3339)
		if l.ttl > 0 {
			lease.Annotations[kubekey.AnnotationTokenExpiry] = at.Add(l.ttl).UTC().Format(time.RFC3339)
		} else {
			delete(lease.Annotations, kubekey.AnnotationTokenExpiry)
		}
		now := metav1.NewMicroTime(at)
		lease.Spec.RenewTime = &now
	})
	if err == nil && previous != "" && previous != tokenID && l.replaced != nil {
		l.replaced(ctx, node, previous)
	}
	return err
}

// ClearToken removes tokenID from the node's record if it is still the
// token recorded there (an operator revoked it), so the CSR approver
// refuses a CSR made with it before the revocation. A record that holds
// another token, or none, is left alone.
func (l *Leases) ClearToken(ctx context.Context, node, tokenID string) error {
	if err := validate(Node, node, "", false); err != nil {
		return err
	}
	name := ObjectName(Node, node)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if lease, ok := l.copies.Take(name); ok && lease.Annotations[kubekey.AnnotationTokenID] == tokenID {
			if err := l.clearTokenOn(ctx, lease); !apierrors.IsConflict(err) {
				return err
			}
		}
		lease, err := l.leases().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("binding: get lease %s/%s: %w", l.ns, name, err)
		}
		if lease.Annotations[kubekey.AnnotationTokenID] != tokenID {
			return nil
		}
		return l.clearTokenOn(ctx, lease)
	})
}

// clearTokenOn writes lease without its token annotations; a Conflict is
// returned as is, for a fresh read.
func (l *Leases) clearTokenOn(ctx context.Context, lease *coordinationv1.Lease) error {
	deleteTokenAnnotations(lease)
	return l.writeLease(ctx, lease)
}

// keep remembers lease, the API server's answer to this replica's write,
// which the caller no longer changes.
func (l *Leases) keep(lease *coordinationv1.Lease) {
	if lease != nil && lease.ResourceVersion != "" {
		l.copies.Put(lease.Name, lease)
	}
}

// writeLease updates lease, conditioned on the version it holds, and
// keeps the written copy; a Conflict is returned as is.
func (l *Leases) writeLease(ctx context.Context, lease *coordinationv1.Lease) error {
	out, err := l.leases().Update(ctx, lease, metav1.UpdateOptions{})
	if err != nil {
		if apierrors.IsConflict(err) {
			return err
		}
		return fmt.Errorf("binding: update lease %s/%s: %w", l.ns, lease.Name, err)
	}
	l.keep(out)
	return nil
}

func deleteTokenAnnotations(lease *coordinationv1.Lease) {
	delete(lease.Annotations, kubekey.AnnotationTokenID)
	delete(lease.Annotations, kubekey.AnnotationTokenRecordedAt)
	delete(lease.Annotations, kubekey.AnnotationTokenExpiry)
}

// updateBoundNode applies mutate to the node's Lease and writes it back,
// retrying on conflicts and re-checking on every try that the record is
// still bound to identity (a release or a rebinding in between wins).
func (l *Leases) updateBoundNode(ctx context.Context, node, identity string, mutate func(*coordinationv1.Lease)) error {
	return l.updateBound(ctx, Node, node, identity, func(lease *coordinationv1.Lease) bool { mutate(lease); return true })
}

// updateBound is updateBoundNode for either kind; mutate reports whether
// it changed anything (no write when it did not). The first try starts
// from this replica's copy of the Lease when it has one (Leases.copies);
// a copy that is stale, or on which anything but a write would be
// decided, is set aside for a fresh read at once.
func (l *Leases) updateBound(ctx context.Context, kind Kind, node, identity string, mutate func(*coordinationv1.Lease) bool) error {
	name := ObjectName(kind, node)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if lease, ok := l.copies.Take(name); ok {
			err := l.writeBound(ctx, lease, kind, node, identity, mutate, true)
			if !errors.Is(err, errStaleCopy) && !apierrors.IsConflict(err) {
				return err
			}
		}
		lease, err := l.leases().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("%w: %s %s", ErrNotFound, kind, node)
		}
		if err != nil {
			return fmt.Errorf("binding: get lease %s/%s: %w", l.ns, name, err)
		}
		return l.writeBound(ctx, lease, kind, node, identity, mutate, false)
	})
}

// errStaleCopy says a copy would decide anything but a write.
var errStaleCopy = errors.New("binding: copy decides no write")

// writeBound checks that lease is bound to identity, applies mutate and
// writes the Lease, conditioned on the version it holds. From a copy
// (fromCopy), any outcome but that write is errStaleCopy.
func (l *Leases) writeBound(ctx context.Context, lease *coordinationv1.Lease, kind Kind, node, identity string, mutate func(*coordinationv1.Lease) bool, fromCopy bool) error {
	r, err := record(lease)
	if err == nil && !r.Bound() {
		err = fmt.Errorf("%w: %s %s was released", ErrNotFound, kind, node)
	}
	if err == nil {
		err = Check(r, identity)
	}
	changed := err == nil && mutate(lease)
	switch {
	case fromCopy && !changed:
		return errStaleCopy
	case err != nil || !changed:
		return err
	}
	return l.writeLease(ctx, lease)
}

// Release implements Store. The update is conditioned on the Lease read
// (its resourceVersion), so what is logged is what was released.
func (l *Leases) Release(ctx context.Context, kind Kind, name, by string) (Record, error) {
	if err := validate(kind, name, "", false); err != nil {
		return Record{}, err
	}
	obj := ObjectName(kind, name)
	lease, err := l.leases().Get(ctx, obj, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return Record{}, fmt.Errorf("%w: %s %s", ErrNotFound, kind, name)
	}
	if err != nil {
		return Record{}, fmt.Errorf("binding: get lease %s/%s: %w", l.ns, obj, err)
	}
	r, err := record(lease)
	if err != nil {
		return Record{}, err
	}
	if !r.Bound() {
		return Record{}, fmt.Errorf("%w: %s %s was already released", ErrNotFound, kind, name)
	}
	delete(lease.Annotations, kubekey.AnnotationIdentity)
	deleteTokenAnnotations(lease)
	lease.Annotations[kubekey.AnnotationReleasedAt] = time.Now().UTC().Format(time.RFC3339)
	lease.Annotations[kubekey.AnnotationReleasedBy] = by
	lease.Spec.HolderIdentity = nil
	out, err := l.leases().Update(ctx, lease, metav1.UpdateOptions{})
	if err != nil {
		return Record{}, fmt.Errorf("binding: release lease %s/%s (changed meanwhile? retry): %w", l.ns, obj, err)
	}
	l.keep(out)
	l.log.Warn("binding released", logkey.Kind, string(kind), logkey.Name, name, logkey.Identity, r.Identity, logkey.By, by)
	return r, nil
}

// List implements Store; a Lease that is not a valid record is skipped
// and reported (*SkippedError).
func (l *Leases) List(ctx context.Context) ([]Record, error) {
	ls, err := l.leases().List(ctx, metav1.ListOptions{LabelSelector: kubekey.LabelManagedBy + "=" + kubekey.ManagedBy + "," + kubekey.LabelBinding})
	if err != nil {
		return nil, fmt.Errorf("binding: list leases in %s: %w", l.ns, err)
	}
	out := make([]Record, 0, len(ls.Items))
	var skipped skipList
	for i := range ls.Items {
		r, err := record(&ls.Items[i])
		if err != nil {
			skipped.add(ls.Items[i].Name, err)
			continue
		}
		out = append(out, r)
	}
	return out, skipped.err()
}

func (l *Leases) leases() coordclient.LeaseInterface {
	return l.client.CoordinationV1().Leases(l.ns)
}

// record reads a binding Lease, refusing one that does not look like
// latchkey wrote it.
func record(lease *coordinationv1.Lease) (Record, error) {
	kind := Kind(lease.Labels[kubekey.LabelBinding])
	name, err := recordName(lease, kind)
	if err != nil {
		return Record{}, err
	}
	r := Record{
		Kind:     kind,
		Name:     name,
		Identity: lease.Annotations[kubekey.AnnotationIdentity],
		TokenID:  lease.Annotations[kubekey.AnnotationTokenID],
		Created:  lease.CreationTimestamp.Time,
	}
	if lease.Spec.AcquireTime != nil {
		r.Created = lease.Spec.AcquireTime.Time
	}
	// The token times are informational (`tokens list`): one that does
	// not parse reads as unknown, not as an invalid record.
	if r.TokenID != "" {
		r.TokenRecorded, _ = time.Parse(time.RFC3339, lease.Annotations[kubekey.AnnotationTokenRecordedAt])
		r.TokenExpiry, _ = time.Parse(time.RFC3339, lease.Annotations[kubekey.AnnotationTokenExpiry])
	}
	if at, ok := lease.Annotations[kubekey.AnnotationReleasedAt]; ok {
		t, err := time.Parse(time.RFC3339, at)
		if err != nil {
			return Record{}, fmt.Errorf("binding: lease %s/%s: released-at %q: %w", lease.Namespace, lease.Name, at, err)
		}
		r.Released, r.ReleasedBy = t, lease.Annotations[kubekey.AnnotationReleasedBy]
	}
	if g, ok := lease.Annotations[kubekey.AnnotationKeyGeneration]; ok {
		n, err := parseGeneration(g)
		if err != nil {
			return Record{}, fmt.Errorf("binding: lease %s/%s: %s %q: %w", lease.Namespace, lease.Name, kubekey.AnnotationKeyGeneration, g, err)
		}
		r.KeyGeneration = &n
	}
	if !validRecord(r) || ObjectName(r.Kind, r.Name) != lease.Name {
		return Record{}, fmt.Errorf("binding: lease %s/%s is not a latchkey binding record", lease.Namespace, lease.Name)
	}
	return r, nil
}

// nameKeys is the annotation that holds each kind's name: the node name,
// the disk UUID.
var nameKeys = map[Kind]string{Node: kubekey.AnnotationNodeName, Disk: kubekey.AnnotationDiskUUID}

// recordName reads a record's name from its kind's annotation or, on a
// Lease a verifier before those annotations wrote, from
// kubekey.AnnotationLegacyName. A Lease that carries both with different
// values, or the other kind's name annotation, is refused: which name it
// binds is unexplained. A Lease of no known kind is left to record's
// validation.
func recordName(lease *coordinationv1.Lease, kind Kind) (string, error) {
	key, ok := nameKeys[kind]
	if !ok {
		return lease.Annotations[kubekey.AnnotationLegacyName], nil
	}
	for k, other := range nameKeys {
		if _, has := lease.Annotations[other]; has && k != kind {
			return "", fmt.Errorf("binding: lease %s/%s: a %s record carries %s", lease.Namespace, lease.Name, kind, other)
		}
	}
	name, has := lease.Annotations[key]
	legacy, hasLegacy := lease.Annotations[kubekey.AnnotationLegacyName]
	switch {
	case has && hasLegacy && name != legacy:
		return "", fmt.Errorf("binding: lease %s/%s: %s %q and %s %q disagree",
			lease.Namespace, lease.Name, key, name, kubekey.AnnotationLegacyName, legacy)
	case has:
		return name, nil
	default:
		return legacy, nil
	}
}
