package binding

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/latchkey/latchkey/internal/kubekey"
)

// OfflineRecorder records that an attested node reported an offline
// unlock (docs/offline-unlock.md), for the taint controller; Leases
// implements it (disk-only mode has no node to taint).
type OfflineRecorder interface {
	// RecordOfflineBoot writes at to the record of node, which must be
	// bound to identity (else a *MismatchError, or ErrNotFound).
	RecordOfflineBoot(ctx context.Context, node, identity string, at time.Time) error
}

var _ OfflineRecorder = (*Leases)(nil)

// RecordOfflineBoot implements OfflineRecorder: one optimistic update of
// the node Lease setting AnnotationBootedOfflineAt. It touches nothing
// else: renewTime stays the last attestation's, so an offline boot never
// looks like one.
func (l *Leases) RecordOfflineBoot(ctx context.Context, node, identity string, at time.Time) error {
	if err := validate(Node, node, identity, true); err != nil {
		return err
	}
	if at.IsZero() {
		return fmt.Errorf("%w: offline boot without a time", ErrInvalid)
	}
	return l.updateBoundNode(ctx, node, identity, func(lease *coordinationv1.Lease) {
		lease.Annotations[kubekey.AnnotationBootedOfflineAt] = at.UTC().Format(time.RFC3339Nano)
	})
}

// readBootedOffline fills st.BootedOffline from the Lease.
func readBootedOffline(lease *coordinationv1.Lease, st *NodeStatus) error {
	at, ok := lease.Annotations[kubekey.AnnotationBootedOfflineAt]
	if !ok {
		return nil
	}
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return fmt.Errorf("binding: lease %s/%s: booted-offline-at %.40q: %w", lease.Namespace, lease.Name, at, err)
	}
	st.BootedOffline = t
	return nil
}
