package binding

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/latchkey/latchkey/internal/kubekey"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A node Lease records the node's latest re-attestation in the
// internal/kubekey annotations: its time, evidence digest, decision and
// reason (AnnotationAttestedAt, AnnotationEvidenceDigest,
// AnnotationDecision, AnnotationReason) and the candidate policy's verdict
// (AnnotationShadowDecision, AnnotationShadowReason). spec.renewTime is
// the time of the latest re-attestation (or of the join that minted the
// node's token): what the taint controller compares with
// reattest.deadline.

// Decisions a re-attestation records.
const (
	DecisionAttested = "attested"
	DecisionRefused  = "refused"
)

// maxReasonLen bounds the recorded reason (a Reason enum name is short).
const maxReasonLen = 64

// Attestation is one re-attestation result as a node Lease records it.
type Attestation struct {
	Time time.Time
	// EvidenceDigest is "sha256:<hex>".
	EvidenceDigest string
	// Decision is DecisionAttested or DecisionRefused.
	Decision string
	// Reason is a latchkey.v1.Reason name ("NONE" when attested).
	Reason string
	// ShadowDecision and ShadowReason are the candidate policy's verdict
	// ("" without a candidate).
	ShadowDecision, ShadowReason string
}

// NodeStatus is what the taint controller reads from a node Lease.
type NodeStatus struct {
	Node     string
	Identity string
	// Renewed is spec.renewTime: the latest re-attestation, or the join
	// that minted the node's token (zero when neither happened).
	Renewed time.Time
	// Last is the latest re-attestation (nil before the first).
	Last *Attestation
	// BootedOffline is when the node last reported an offline unlock
	// (offline.go); zero when it never did.
	BootedOffline time.Time
}

// AttestationRecorder records re-attestation results; Leases implements
// it (the directory store of disk-only mode has no nodes to taint).
type AttestationRecorder interface {
	// RecordAttestation writes a to the record of node, which must be
	// bound to identity (else a *MismatchError, or ErrNotFound when it
	// was released or never claimed).
	RecordAttestation(ctx context.Context, node, identity string, a Attestation) error
}

var _ AttestationRecorder = (*Leases)(nil)

// validAttestation checks what RecordAttestation is asked to write.
func validAttestation(a Attestation) error {
	switch {
	case a.Time.IsZero():
		return fmt.Errorf("%w: attestation without a time", ErrInvalid)
	case a.Decision != DecisionAttested && a.Decision != DecisionRefused:
		return fmt.Errorf("%w: decision %.32q", ErrInvalid, a.Decision)
	case !strings.HasPrefix(a.EvidenceDigest, "sha256:") || len(a.EvidenceDigest) != len("sha256:")+64:
		return fmt.Errorf("%w: evidence digest %.80q", ErrInvalid, a.EvidenceDigest)
	case !validReason(a.Reason):
		return fmt.Errorf("%w: reason %.80q", ErrInvalid, a.Reason)
	case a.ShadowDecision == "" && a.ShadowReason != "":
		return fmt.Errorf("%w: shadow reason without a shadow decision", ErrInvalid)
	case a.ShadowDecision != "" && (!validReason(a.ShadowReason) || len(a.ShadowDecision) > 16 || strings.ContainsAny(a.ShadowDecision, " \n\r\x00")):
		return fmt.Errorf("%w: shadow decision %.32q reason %.80q", ErrInvalid, a.ShadowDecision, a.ShadowReason)
	}
	return nil
}

func validReason(r string) bool {
	return r != "" && len(r) <= maxReasonLen && !strings.ContainsAny(r, " \n\r\x00")
}

// RecordAttestation implements AttestationRecorder: one optimistic update
// of the node Lease (retried on conflict, re-checking the identity each
// time), setting spec.renewTime to a.Time and the four attestation
// annotations. It never touches the identity or token annotations.
func (l *Leases) RecordAttestation(ctx context.Context, node, identity string, a Attestation) error {
	if err := validate(Node, node, identity, true); err != nil {
		return err
	}
	if err := validAttestation(a); err != nil {
		return err
	}
	return l.updateBoundNode(ctx, node, identity, func(lease *coordinationv1.Lease) {
		lease.Annotations[kubekey.AnnotationAttestedAt] = a.Time.UTC().Format(time.RFC3339Nano)
		lease.Annotations[kubekey.AnnotationEvidenceDigest] = a.EvidenceDigest
		lease.Annotations[kubekey.AnnotationDecision] = a.Decision
		lease.Annotations[kubekey.AnnotationReason] = a.Reason
		if a.ShadowDecision != "" {
			lease.Annotations[kubekey.AnnotationShadowDecision] = a.ShadowDecision
			lease.Annotations[kubekey.AnnotationShadowReason] = a.ShadowReason
		} else {
			delete(lease.Annotations, kubekey.AnnotationShadowDecision)
			delete(lease.Annotations, kubekey.AnnotationShadowReason)
		}
		renew := metav1.NewMicroTime(a.Time)
		lease.Spec.RenewTime = &renew
	})
}

// NodeStatuses lists every bound node record with its latest
// re-attestation, for the taint controller. A Lease that is not a valid
// record is skipped (and counted in the error), not fatal: one bad object
// must not blind the controller to every other node.
func (l *Leases) NodeStatuses(ctx context.Context) ([]NodeStatus, error) {
	ls, err := l.leases().List(ctx, metav1.ListOptions{LabelSelector: kubekey.LabelManagedBy + "=" + kubekey.ManagedBy + "," + kubekey.LabelBinding + "=" + string(Node)})
	if err != nil {
		return nil, fmt.Errorf("binding: list leases in %s: %w", l.ns, err)
	}
	out := make([]NodeStatus, 0, len(ls.Items))
	var bad []error
	for i := range ls.Items {
		st, err := nodeStatus(&ls.Items[i])
		if err != nil {
			bad = append(bad, err)
			continue
		}
		if st.Identity != "" {
			out = append(out, st)
		}
	}
	return out, errors.Join(bad...)
}

// nodeStatus reads one node Lease.
func nodeStatus(lease *coordinationv1.Lease) (NodeStatus, error) {
	r, err := record(lease)
	if err != nil {
		return NodeStatus{}, err
	}
	st := NodeStatus{Node: r.Name, Identity: r.Identity}
	if lease.Spec.RenewTime != nil {
		st.Renewed = lease.Spec.RenewTime.Time
	}
	if at, ok := lease.Annotations[kubekey.AnnotationAttestedAt]; ok {
		t, err := time.Parse(time.RFC3339Nano, at)
		if err != nil {
			return NodeStatus{}, fmt.Errorf("binding: lease %s/%s: attested-at %.40q: %w", lease.Namespace, lease.Name, at, err)
		}
		a := Attestation{Time: t, EvidenceDigest: lease.Annotations[kubekey.AnnotationEvidenceDigest],
			Decision: lease.Annotations[kubekey.AnnotationDecision], Reason: lease.Annotations[kubekey.AnnotationReason],
			ShadowDecision: lease.Annotations[kubekey.AnnotationShadowDecision], ShadowReason: lease.Annotations[kubekey.AnnotationShadowReason]}
		if err := validAttestation(a); err != nil {
			return NodeStatus{}, fmt.Errorf("binding: lease %s/%s: %w", lease.Namespace, lease.Name, err)
		}
		st.Last = &a
	}
	if err := readBootedOffline(lease, &st); err != nil {
		return NodeStatus{}, err
	}
	return st, nil
}
