package csr

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"

	"github.com/latchkey/latchkey/internal/logkey"
	"github.com/latchkey/latchkey/verifier/token"
)

// Revoker deletes a bootstrap token (Kube does).
type Revoker interface {
	Revoke(ctx context.Context, id string) error
}

// PresentRevoker is a Revoker that also tells whether the token was still
// there (token.Kube is one). With it, a token another verifier process
// already reaped (this one restarted and saw the CSR again) is neither
// counted nor logged as deleted again.
type PresentRevoker interface {
	RevokePresent(ctx context.Context, id string) (bool, error)
}

// ReaperConfig configures the Reaper.
type ReaperConfig struct {
	Client  kubernetes.Interface
	Revoker Revoker
	Logger  *slog.Logger
	// OnReaped is told of each token deleted after use (for a metric);
	// optional.
	OnReaped func()
	// Resync re-examines CSRs and Nodes (default 30s); with Informers,
	// that factory's resync period applies instead.
	Resync time.Duration
	// Informers, when set, is the informer factory the reaper shares with
	// the verifier's other controllers (as ApproverConfig.Informers).
	Informers informers.SharedInformerFactory
	// Workers is how many Nodes are examined (and their tokens deleted)
	// at once (DefaultWorkers when zero).
	Workers int
	// Forget, when set, is told of each token deleted after use, with its
	// node, so the node's binding record stops naming it (`tokens list`
	// then looks only at tokens not yet used). Its failure is logged.
	Forget func(ctx context.Context, node, tokenID string) error
}

// Reaper deletes a node's bootstrap token as soon as the node no longer
// needs it, instead of leaving it alive for its whole TTL: live tokens
// then count joins in flight, not nodes joined in the last half hour.
//
// The safe moment is proven, not guessed: the kubelet client CSR made
// with the token was approved and its certificate issued (so the kubelet
// holds system:node:<name> credentials), and afterwards the Node of that
// name registered or posted its status (which the kubelet does with those
// credentials, not the token). Deleting earlier could strand a kubelet
// still fetching its certificate with the token. A token whose node never
// gets that far, or that the reaper did not see (a verifier restart after
// the CSR was garbage-collected), expires at its TTL as before.
type Reaper struct {
	cfg ReaperConfig
	log *slog.Logger

	mu      sync.Mutex
	pending map[string]issued // node name -> the token that got its certificate
	// reaped are the tokens already deleted (ID -> approval time), so an
	// informer resync that shows their CSR again deletes and counts
	// nothing twice; entries go after reapedKeep (the controller-manager
	// removes issued CSRs after an hour).
	reaped    map[string]time.Time
	lastPrune time.Time
}

// reapedKeep is how long a deleted token is remembered.
const reapedKeep = 2 * time.Hour

type issued struct {
	tokenID string
	at      time.Time
}

// NewReaper checks cfg.
func NewReaper(cfg ReaperConfig) (*Reaper, error) {
	if cfg.Client == nil || cfg.Revoker == nil {
		return nil, errors.New("token reaper: no Kubernetes client or revoker")
	}
	cfg.Resync = resync(cfg.Resync)
	return &Reaper{cfg: cfg, log: componentLog(cfg.Logger, "token-reaper"), pending: map[string]issued{},
		reaped: map[string]time.Time{}}, nil
}

// Run watches CSRs and Nodes until ctx ends.
func (r *Reaper) Run(ctx context.Context) error {
	f, done := informerFactory(r.cfg.Informers, r.cfg.Client, r.cfg.Resync)
	csrs := f.Certificates().V1().CertificateSigningRequests().Informer()
	nodes := f.Core().V1().Nodes().Informer()
	onCSR := func(obj any) {
		if csr, ok := obj.(*certv1.CertificateSigningRequest); ok {
			r.ObserveCSR(csr)
		}
	}
	if _, err := csrs.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: onCSR, UpdateFunc: func(_, o any) { onCSR(o) }}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	defer done()
	go logSynced(ctx, r.log, csrs.HasSynced, nodes.HasSynced)
	// CSRs are only noted (in memory, in the callback); a Node may cost a
	// token deletion, so Nodes go to workers.
	return runQueued(ctx, nodes, r.cfg.Workers, func(ctx context.Context, obj any) {
		if n, ok := obj.(*corev1.Node); ok {
			r.ObserveNode(ctx, n)
		}
	})
}

// ObserveCSR notes a latchkey token whose kubelet client certificate was
// issued.
func (r *Reaper) ObserveCSR(csr *certv1.CertificateSigningRequest) {
	if csr.Spec.SignerName != certv1.KubeAPIServerClientKubeletSignerName || len(csr.Status.Certificate) == 0 ||
		!slices.Contains(csr.Spec.Groups, token.Group) {
		return
	}
	id, ok := strings.CutPrefix(csr.Spec.Username, bootstrapapi.BootstrapUserPrefix)
	if !ok || !token.ValidID(id) {
		return
	}
	req, err := parseCSR(csr.Spec.Request)
	if err != nil {
		return
	}
	node, ok := strings.CutPrefix(req.Subject.CommonName, nodeUserPrefix)
	if !ok || !slices.Contains(csr.Spec.Groups, token.NodeGroup(node)) {
		return
	}
	at := approvedAt(csr)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, done := r.reaped[id]; done {
		return
	}
	if cur, seen := r.pending[node]; !seen || cur.at.Before(at) {
		r.pending[node] = issued{tokenID: id, at: at}
	}
}

// ObserveNode deletes the token of a node that registered or reported
// after its certificate was issued.
func (r *Reaper) ObserveNode(ctx context.Context, n *corev1.Node) {
	r.mu.Lock()
	p, ok := r.pending[n.Name]
	r.mu.Unlock()
	if !ok || !usedCredentialsSince(n, p.at) {
		return
	}
	present, err := r.revoke(ctx, p.tokenID)
	if err != nil {
		r.log.Warn("could not delete a used bootstrap token; it expires at its TTL", logkey.Node, n.Name,
			logkey.TokenID, p.tokenID, logkey.Error, err.Error())
		return
	}
	r.mu.Lock()
	if r.pending[n.Name] == p {
		delete(r.pending, n.Name)
	}
	r.reaped[p.tokenID] = p.at
	r.pruneReaped(time.Now())
	r.mu.Unlock()
	if r.cfg.Forget != nil {
		if err := r.cfg.Forget(ctx, n.Name, p.tokenID); err != nil {
			r.log.Warn("used bootstrap token deleted, but its node record still names it", logkey.Node, n.Name,
				logkey.TokenID, p.tokenID, logkey.Error, err.Error())
		}
	}
	if !present {
		return
	}
	if r.cfg.OnReaped != nil {
		r.cfg.OnReaped()
	}
	r.log.Info("bootstrap token deleted after use", logkey.Node, n.Name, logkey.TokenID, p.tokenID)
}

// approvedAt is when the CSR was approved (the certificate follows).
func approvedAt(csr *certv1.CertificateSigningRequest) time.Time {
	for _, c := range csr.Status.Conditions {
		if c.Type == certv1.CertificateApproved {
			return c.LastUpdateTime.Time
		}
	}
	return csr.CreationTimestamp.Time
}

// usedCredentialsSince reports whether the Node was created, or had a
// condition heartbeat, at or after t: both are written by a kubelet that
// already holds its own client certificate. Times are the API server's
// and the kubelet's own clocks, so one second of slack is allowed.
func usedCredentialsSince(n *corev1.Node, t time.Time) bool {
	t = t.Add(-time.Second)
	if !n.CreationTimestamp.Time.Before(t) {
		return true
	}
	for _, c := range n.Status.Conditions {
		if !c.LastHeartbeatTime.Time.Before(t) {
			return true
		}
	}
	return false
}

// pruneReaped forgets deleted tokens approved more than reapedKeep ago,
// at most every reapedKeep/4; r.mu is held.
func (r *Reaper) pruneReaped(now time.Time) {
	if now.Sub(r.lastPrune) < reapedKeep/4 {
		return
	}
	r.lastPrune = now
	for id, at := range r.reaped {
		if now.Sub(at) > reapedKeep {
			delete(r.reaped, id)
		}
	}
}

// revoke deletes the token and tells whether it was still there (always
// true for a Revoker that cannot tell).
func (r *Reaper) revoke(ctx context.Context, id string) (bool, error) {
	if pr, ok := r.cfg.Revoker.(PresentRevoker); ok {
		return pr.RevokePresent(ctx, id)
	}
	return true, r.cfg.Revoker.Revoke(ctx, id)
}
