// Package kubekey is latchkey's Kubernetes vocabulary: the one spelling of
// every label, annotation and taint key latchkey puts on a Kubernetes
// object (binding Leases, bootstrap token Secrets, Nodes). A key is part of
// the cluster's stored state and of what operators select on with kubectl,
// so it is spelled once: two packages that write the same fact (the node
// name on a Lease and on a Secret) use the same constant, and a rename is
// one edit that every reader follows. Code names these keys with the
// constants, never with a string literal; a test of this package walks the
// tree and fails on a "latchkey.io" literal anywhere else.
//
// A key, once written by a released verifier, is read by the next one:
// replacing a key means reading the old one too (AnnotationLegacyName).
package kubekey

// Ownership, on every object latchkey writes.
const (
	// LabelManagedBy is the Kubernetes recommended label that marks the
	// binding Leases and token Secrets latchkey wrote; List selects on it.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ManagedBy is latchkey's LabelManagedBy value.
	ManagedBy = "latchkey"
)

// Binding Leases (verifier/binding): one per node name and one per disk,
// each bound to a machine identity.
const (
	// LabelBinding is the record's kind: "node" or "disk".
	LabelBinding = "latchkey.io/binding"
	// AnnotationNodeName is the node name a node Lease binds (the Lease's
	// name may be a hash of a long node name), and the attested node name
	// on a token Secret.
	AnnotationNodeName = "latchkey.io/node-name"
	// AnnotationDiskUUID is the LUKS2 UUID a disk Lease binds.
	AnnotationDiskUUID = "latchkey.io/disk-uuid"
	// AnnotationLegacyName is the node name or disk UUID as verifiers
	// before AnnotationNodeName and AnnotationDiskUUID wrote it on both
	// kinds of Lease. It is read, never written: records created by
	// running clusters keep working, and a Lease whose legacy and current
	// names differ is refused.
	AnnotationLegacyName = "latchkey.io/name"
	// AnnotationIdentity is the bound machine identity (also the Lease's
	// spec.holderIdentity, which Kubernetes tools show).
	AnnotationIdentity = "latchkey.io/identity"
	// AnnotationTokenID is the ID of the last bootstrap token minted for a
	// node; the CSR approver honours only that token.
	AnnotationTokenID = "latchkey.io/token-id"
	// AnnotationTokenRecordedAt (RFC 3339) is when that token's ID was
	// recorded (its Secret had just been written), so `tokens list` can
	// show it without reading the Secret, which the verifier may not.
	AnnotationTokenRecordedAt = "latchkey.io/token-recorded-at"
	// AnnotationTokenExpiry (RFC 3339) is when that token expires.
	AnnotationTokenExpiry = "latchkey.io/token-expiry"
	// AnnotationReleasedAt (RFC 3339) marks a released record (a
	// tombstone: no identity, no token).
	AnnotationReleasedAt = "latchkey.io/released-at"
	// AnnotationReleasedBy is who released the record (the admin
	// caller's uid and pid).
	AnnotationReleasedBy = "latchkey.io/released-by"
	// AnnotationKeyGeneration is the master-secret generation a disk's
	// last join named (decimal; absent: unknown).
	AnnotationKeyGeneration = "latchkey.io/key-generation"
)

// Re-attestation results on a node Lease (verifier/binding, written by
// verifier/service, read by the taint controller and `policy diff`).
const (
	// AnnotationAttestedAt is the latest re-attestation's time (RFC 3339
	// with nanoseconds, UTC).
	AnnotationAttestedAt = "latchkey.io/attested-at"
	// AnnotationEvidenceDigest is "sha256:<hex>" of the evidence accepted
	// or judged: the latest re-attestation's on a node Lease, the join's
	// on a token Secret.
	AnnotationEvidenceDigest = "latchkey.io/evidence-digest"
	// AnnotationDecision is the latest re-attestation's verdict:
	// "attested" or "refused".
	AnnotationDecision = "latchkey.io/decision"
	// AnnotationReason is the refusal reason (a latchkey.v1.Reason name),
	// "NONE" when attested.
	AnnotationReason = "latchkey.io/reason"
	// AnnotationShadowDecision is the candidate policy's (policyNext)
	// verdict on the same evidence: accepted, refused or unknown; absent
	// without a candidate. `latchkey-verifier policy diff` lists it.
	AnnotationShadowDecision = "latchkey.io/shadow-decision"
	// AnnotationShadowReason is the candidate policy's refusal reason.
	AnnotationShadowReason = "latchkey.io/shadow-reason"
	// AnnotationBootedOfflineAt (RFC 3339 with nanoseconds, UTC) is when
	// an attested node last reported that it unlocked its disk offline
	// (docs/offline-unlock.md); the node is tainted offline until a
	// re-attestation after it succeeds.
	AnnotationBootedOfflineAt = "latchkey.io/booted-offline-at"
)

// Bootstrap token Secrets (verifier/token).
const (
	// LabelNodeHash carries the hash of the node name a token was minted
	// for, so an operator can list one node's tokens (a label value
	// cannot hold every node name).
	LabelNodeHash = "latchkey.io/node-hash"
	// LabelRole is the token's node role: "worker" or "control-plane".
	LabelRole = "latchkey.io/role"
)

// Nodes (verifier/reattest).
const (
	// TaintUnattested is the taint the re-attestation controller keeps on
	// every Node that is not currently attested (value "refused",
	// "offline" or "stale").
	TaintUnattested = "latchkey.io/unattested"
	// AnnotationCordoned marks a cordon latchkey's agent set (value
	// "offline"): after an offline unlock it sets spec.unschedulable with
	// the kubelet's own credentials, which may not taint its Node
	// (NodeRestriction). The verifier lifts only a cordon that carries it,
	// never an operator's.
	AnnotationCordoned = "latchkey.io/cordoned"
	// AnnotationCordonedAt (RFC 3339, UTC, the API server's clock) is when
	// the agent cordoned the Node; only a re-attestation accepted after it
	// lifts the cordon.
	AnnotationCordonedAt = "latchkey.io/cordoned-at"
)
