// Package logkey is latchkey's log vocabulary: the one name of every key
// the agent and the verifier put on a log line. A concept has one key
// wherever it is logged (an error is always error=, a disk's LUKS UUID
// always disk_uuid=), so an operator, a doc or the e2e harness greps one
// spelling and finds every line that carries it. Code logs with these
// constants, never with a string literal; a test of this package walks
// the tree and fails on a literal key.
//
// No key holds a secret: no disk key, master secret or token secret is
// ever a value of any of them (KeyBytes is a length, KeyID a one-way derivation,
// TokenID the public half of a bootstrap token).
package logkey

// Identity of the node, the disk and the request.
const (
	// Node is the Kubernetes node name the line is about.
	Node = "node"
	// Identity is a machine identity the verifier binds names to
	// (tpm-ek:sha256:…, snp-chip:…), the audit line's verified one.
	Identity = "identity"
	// BoundIdentity is the identity a node or disk binding already holds,
	// logged beside Identity when the two are compared.
	BoundIdentity = "bound_identity"
	// DiskUUID is the state disk's LUKS2 UUID.
	DiskUUID = "disk_uuid"
	// Role is a node's Kubernetes role: the enum name (ROLE_WORKER) on
	// the audit line, the label (worker, control-plane) on a token's.
	Role = "role"
	// Rejoin is whether the node asked as a rejoin (its disk already
	// carries a latchkey header).
	Rejoin = "rejoin"
	// Purpose is why a node attests: join or reattest.
	Purpose = "purpose"
	// Variant is the attestation variant's enum name (VARIANT_TPM,
	// VARIANT_SEV_SNP).
	Variant = "variant"
	// RequestToken is whether a rejoin asked for a bootstrap token (a
	// bool, never a token).
	RequestToken = "request_token"
	// EvidenceDigest is sha256:<hex> of the evidence a node sent; the
	// agent's and the verifier's lines carry the same value.
	EvidenceDigest = "evidence_digest"
)

// Decisions and their outcome.
const (
	// Result is how a join or a re-attestation ended: on the verifier's
	// audit line accepted, refused, failed or handover_failed (the
	// joins_total label), on the agent's attested, refused or unreachable.
	Result = "result"
	// Reason is the latchkey Reason enum name of a refusal
	// (COMPONENT_NOT_ALLOWED; NONE on an accepted join's audit line), or
	// why the re-attestation controller holds a node unattested.
	Reason = "reason"
	// Error is the text of the error behind the line.
	Error = "error"
	// Cause is why a bootstrap token was revoked or the mint rolled back
	// (used, denied, expired, ...), as the revoke metrics' label.
	Cause = "cause"
	// Verdict is the CSR approver's decision on one CSR.
	Verdict = "verdict"
	// Why is the CSR approver's one-line explanation of its verdict.
	Why = "why"
	// Policy is the digest (sha256:…) of the policy that decided.
	Policy = "policy"
	// ShadowDecision is the result the shadow policy would have given.
	ShadowDecision = "shadow_decision"
	// ShadowReason is the shadow policy's Reason name.
	ShadowReason = "shadow_reason"
	// ShadowPolicy is the shadow policy's digest.
	ShadowPolicy = "shadow_policy"
	// Deny is the policy deny entry a node matched ("deny.<key>: <value>").
	Deny = "deny"
	// Adopted lists the binding kinds (disk, node, comma-separated) an
	// unrecorded rejoin adopted.
	Adopted = "adopted"
	// State is a node's re-attestation state (attested, stale, refused).
	State = "state"
	// Effect is the taint effect the re-attestation controller applies.
	Effect = "effect"
	// Deadline is how long a node may go without re-attesting.
	Deadline = "deadline"
	// ValidationMS is how long the evidence check took, in milliseconds.
	ValidationMS = "validation_ms"
)

// Tokens, keys and CSRs: identifiers and sizes only, never secrets.
const (
	// TokenID is a bootstrap token's public ID (the part before the dot).
	TokenID = "token_id"
	// Expiry is when a bootstrap token expires (RFC 3339, UTC).
	Expiry = "expiry"
	// KeyID is the master secret's non-secret ID (kid-<hex>, derived one
	// way from it).
	KeyID = "key_id"
	// KeyBytes is the length in bytes of the disk key a ticket carried.
	KeyBytes = "key_bytes"
	// KeyGeneration is a master-secret generation: the one a disk is keyed
	// under, or the one a ticket's key belongs to.
	KeyGeneration = "key_generation"
	// FromGeneration is the generation a rewrap moved a disk's keyslot from.
	FromGeneration = "from_generation"
	// Current says whether a master-secret generation is the current one.
	Current = "current"
	// FinishedInterrupted says a rewrap only finished one a crash interrupted.
	FinishedInterrupted = "finished_interrupted"
	// CSR is a CertificateSigningRequest's name.
	CSR = "csr"
	// Signer is a CSR's signerName.
	Signer = "signer"
	// Requester is the user who created a CSR.
	Requester = "requester"
)

// Where: endpoints, sockets, files and devices.
const (
	// Endpoint is the host:port the program dials: a verifier, or the
	// Kubernetes API server of a join.
	Endpoint = "endpoint"
	// Address is the address a server listens on.
	Address = "address"
	// Socket is the path of a unix socket.
	Socket = "socket"
	// Peer is the remote address of a connection the program accepted.
	Peer = "peer"
	// Waited is how long the program waited for something it needed.
	Waited = "waited"
	// Timeout is how long the program will wait at most.
	Timeout = "timeout"
	// Path is a file or directory path.
	Path = "path"
	// File is the name of a cached or stored collateral file (a VCEK).
	File = "file"
	// URL is the URL fetched.
	URL = "url"
	// Device is a block device path.
	Device = "device"
	// MountPoint is where the state file system is mounted.
	MountPoint = "mount_point"
	// Product is the AMD product line (Milan, Genoa) of SEV-SNP collateral.
	Product = "product"
)

// The state disk.
const (
	// FSType is the state file system's type (xfs, ext4).
	FSType = "fstype"
	// Want is the value configuration asks for, beside Found.
	Want = "want"
	// Found is what the disk stage found on a device (a file system type,
	// a foreign header).
	Found = "found"
	// WipeStateDisk is the wipeStateDisk setting that allowed or refused
	// a wipe.
	WipeStateDisk = "wipe_state_disk"
	// KubeletCredentials is whether the state disk holds kubelet
	// credentials from an earlier join.
	KubeletCredentials = "kubelet_credentials"
	// BlankCheck is the rule that admitted a state disk as blank for a
	// first boot ("full" or "sampled").
	BlankCheck = "blank_check"
	// BytesRead is how many bytes a long device read has read so far.
	BytesRead = "bytes_read"
	// BytesTotal is how many bytes a long device read reads in all.
	BytesTotal = "bytes_total"
	// RateMBs is a transfer rate in MB/s (10^6 bytes per second).
	RateMBs = "rate_mb_s"
	// Elapsed is how long an operation has run so far.
	Elapsed = "elapsed"
)

// Components, stages and commands.
const (
	// Component names the part of a program that logs (a logger's With).
	Component = "component"
	// Stage names the agent boot stage that logs (a logger's With).
	Stage = "stage"
	// Kind is a binding's kind (node, disk).
	Kind = "kind"
	// Name is a binding's bound name (a node name or a disk UUID).
	Name = "name"
	// Record is a store record's key (file, Lease or etcd key), e.g. one
	// a listing skipped because it could not be read.
	Record = "record"
	// By is who released a binding ("admin uid=<uid> pid=<pid>" for the
	// admin API).
	By = "by"
	// ControlPlane is whether a join joins a control-plane node.
	ControlPlane = "control_plane"
	// DryRun is whether kubeadm runs with --dry-run.
	DryRun = "dry_run"
	// Present is whether the object a delete named was still there.
	Present = "present"
	// DiskOnly is whether the verifier runs without Kubernetes (no tokens).
	DiskOnly = "disk_only"
	// Command is the program a command ran.
	Command = "cmd"
	// Args are a command's arguments (never a secret: keys go on stdin).
	Args = "args"
	// Stdin is whether a command was given input on stdin.
	Stdin = "stdin"
	// Stream is stdout or stderr of a command whose output is logged.
	Stream = "stream"
	// Line is one line of a command's output.
	Line = "line"
	// Exit is a process's exit code.
	Exit = "exit"
	// Method is the full gRPC method of an admin call.
	Method = "method"
	// Code is the gRPC status code of a call.
	Code = "code"
	// UID is a peer process's user ID.
	UID = "uid"
	// GID is a peer process's group ID.
	GID = "gid"
	// PID is a peer process's ID.
	PID = "pid"
	// CertificateTableBytes is the size of an SEV-SNP report's
	// certificate table.
	CertificateTableBytes = "certificate_table_bytes"
)

// Time and retries.
const (
	// Duration is how long an operation took.
	Duration = "duration"
	// Attempt is the number of this attempt, from 1.
	Attempt = "attempt"
	// Attempts is how many attempts will be made at the most.
	Attempts = "attempts"
	// RetryIn is how long the program waits before the next attempt.
	RetryIn = "retry_in"
	// RetryAfterMS is the retry hint, in milliseconds, a refused caller
	// is given.
	RetryAfterMS = "retry_after_ms"
	// Round is the number of a re-attestation round, from 1.
	Round = "round"
	// NextIn is how long until the next re-attestation round.
	NextIn = "next_in"
	// Suppressed is how many like events were not logged since the
	// last line about them (a rate-limited warning).
	Suppressed = "suppressed"
)

// Offline unlock (docs/offline-unlock.md): the verifier's grants and the
// agent's offline boots.
const (
	// OfflineMaxBoots is a grant's boot bound (offlineUnlock.maxBoots).
	OfflineMaxBoots = "offline_max_boots"
	// OfflineMaxHours is a grant's time bound (offlineUnlock.maxHours).
	OfflineMaxHours = "offline_max_hours"
	// OfflineBoot is an offline boot's number since the attestation that
	// granted it (1 = the first), as the agent counts it and reports it.
	OfflineBoot = "offline_boot"
	// SealedPCRs are the PCR indices a grant is sealed to ("0,1,2,…").
	SealedPCRs = "sealed_pcrs"
	// TPMResetCount is the quote's TPM reset count a grant counts boots
	// from.
	TPMResetCount = "tpm_reset_count"
	// TPMClockMS is the quote's TPM clock (ms) a grant counts hours from.
	TPMClockMS = "tpm_clock_ms"
	// OfflineHeld is whether the state disk now holds an offline token.
	OfflineHeld = "offline_held"
	// OfflineHoursLeft is the TPM time left before the grant expires.
	OfflineHoursLeft = "offline_hours_left"
	// OfflineAfter is how long the agent tries the verifiers before it
	// unlocks offline.
	OfflineAfter = "offline_after"
)
