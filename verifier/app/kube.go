package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/latchkey/latchkey/internal/logkey"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/csr"
	"github.com/latchkey/latchkey/verifier/metrics"
	"github.com/latchkey/latchkey/verifier/policy"
	"github.com/latchkey/latchkey/verifier/service"
	"github.com/latchkey/latchkey/verifier/token"
)

// KubeconfigCredential is the systemd credential holding the verifier's
// narrow Kubernetes credential when no kubeconfig path is configured.
const KubeconfigCredential = "latchkey-kubeconfig"

// newKubeMinter builds the client-go token step from the Kubernetes section.
func newKubeMinter(k *Kubernetes, log *slog.Logger) (kubernetes.Interface, token.Minter, error) {
	rc, err := restConfig(k)
	if err != nil {
		return nil, nil, err
	}
	client, err := clientFor(rc)
	if err != nil {
		return nil, nil, err
	}
	// A ticket goes out once the API server authenticates its token.
	usable, err := token.NewAuthenticates(rc)
	if err != nil {
		return nil, nil, err
	}
	m, err := token.NewKube(token.KubeConfig{Client: client, Logger: log, TTL: k.TokenTTL.Duration,
		SignatureWait: k.JWSWait.Duration, Endpoints: k.APIServerEndpoints, CACertHashes: k.CACertHashes,
		CertificatesDir: k.CertificatesDir, TokenDiscovery: k.Discovery == "token", Authenticates: usable})
	return client, m, err
}

// tokenTTL is the minter's token lifetime, which the binding Leases
// record as each token's expiry.
func tokenTTL(k *Kubernetes) time.Duration {
	if k == nil || k.TokenTTL.Duration == 0 {
		return token.DefaultTTL
	}
	return k.TokenTTL.Duration
}

// revokeReplaced deletes a node's earlier token once a new one is
// recorded for it (binding.LeaseConfig.OnTokenReplaced): the approver no
// longer honours it, and no record would name it. A token already gone is
// not an error (Revoke); a failure leaves it to its TTL.
func revokeReplaced(m token.Minter, log *slog.Logger) func(ctx context.Context, node, id string) {
	if m == nil {
		return nil
	}
	return func(ctx context.Context, node, id string) {
		if err := m.Revoke(ctx, id); err != nil {
			log.Warn("could not delete a node's replaced bootstrap token; it expires at its TTL", logkey.Node, node,
				logkey.TokenID, id, logkey.Error, err.Error())
			return
		}
		log.Info("replaced bootstrap token deleted", logkey.Node, node, logkey.TokenID, id)
	}
}

// runApprover approves kubelet CSRs only for the node names the verifier
// attested (kubeadm's blanket auto-approval is off for latchkey's tokens).
// It runs until ctx ends; its failure is logged, joins go on.
func runApprover(ctx context.Context, client kubernetes.Interface, f informers.SharedInformerFactory, b binding.Store, pol policy.Source, k *Kubernetes, log *slog.Logger) {
	a, err := csr.NewApprover(csr.ApproverConfig{Client: client, Informers: f, Tokens: NodeTokens{Store: b, Policy: pol}, Logger: log,
		ServingCertificates: k.ApproveServingCertificates})
	if err == nil {
		err = a.Run(ctx)
	}
	if err != nil && ctx.Err() == nil {
		log.Error("csr approver stopped; new nodes cannot get kubelet certificates", logkey.Error, err.Error())
	}
}

// NodeTokens gives the CSR approver the token ID a node's binding record
// holds: "" when the node has no record (or a released one), or when the
// policy in force denies the node's name or its bound machine (by an
// identity entry, or as the machine bound to a denied name or disk), so its CSR
// is denied (a CSR made with a token before the node was revoked is not
// signed after).
type NodeTokens struct {
	Store binding.Store
	// Policy supplies the deny list; nil denies nothing.
	Policy policy.Source
}

// NodeTokenID implements csr.NodeTokens.
func (n NodeTokens) NodeTokenID(ctx context.Context, node string) (string, error) {
	r, err := n.Store.Get(ctx, binding.Node, node)
	if errors.Is(err, binding.ErrNotFound) || errors.Is(err, binding.ErrInvalid) {
		return "", nil
	}
	if err == nil && n.Policy != nil {
		d := n.Policy.Current().Deny
		if d.DeniesNode(node) || d.MatchIdentity(r.Identity) != "" {
			return "", nil
		}
		// A denied name or disk denies the machine bound to it, under
		// this name too.
		entry, derr := service.DeniedByBinding(ctx, n.Store, d, r.Identity)
		if derr != nil || entry != "" {
			return "", derr
		}
	}
	return r.TokenID, err
}

// kubeClient is the client of k's kubeconfig, or of the systemd
// credential.
func kubeClient(k *Kubernetes) (kubernetes.Interface, error) {
	rc, err := restConfig(k)
	if err != nil {
		return nil, err
	}
	return clientFor(rc)
}

// clientFor is the clientset of rc.
func clientFor(rc *rest.Config) (kubernetes.Interface, error) {
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	return c, nil
}

// restConfig reads k's kubeconfig, or the systemd credential.
func restConfig(k *Kubernetes) (*rest.Config, error) {
	path := k.Kubeconfig
	if path == "" {
		dir := os.Getenv("CREDENTIALS_DIRECTORY")
		if dir == "" {
			return nil, errors.New("kubernetes: no kubeconfig configured and $CREDENTIALS_DIRECTORY is not set")
		}
		path = filepath.Join(dir, KubeconfigCredential)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: kubeconfig %s: %w", path, err)
	}
	rc.UserAgent = "latchkey-verifier"
	// A whole join is about ten requests; client-go's default 5/s (and
	// the 100/s latchkey had) throttled a boot storm to ~10 joins/s.
	rc.QPS, rc.Burst = DefaultAPIQPS, 2*DefaultAPIQPS
	if k.APIQPS > 0 {
		rc.QPS, rc.Burst = k.APIQPS, 2*int(k.APIQPS)
	}
	if k.APIBurst > 0 {
		rc.Burst = k.APIBurst
	}
	return rc, nil
}

// controllerResync is how often the approver and the reaper re-examine
// every CSR and Node they cache (their own default, 30s).
const controllerResync = 30 * time.Second

// The reaper counts a used token only when it was still there to delete.
var _ csr.PresentRevoker = (*token.Kube)(nil)

// runReaper deletes each node's bootstrap token once the node has used
// it (certificate issued, Node registered), and clears it from the node's
// binding record; tokens it misses expire at their TTL.
func runReaper(ctx context.Context, client kubernetes.Interface, f informers.SharedInformerFactory, revoker csr.Revoker, b binding.Store, m *metrics.Metrics, log *slog.Logger) {
	cfg := csr.ReaperConfig{Client: client, Informers: f, Revoker: revoker, Logger: log,
		OnReaped: func() { m.TokenRevoked(metrics.RevokeUsed) }}
	if c, ok := b.(tokenClearer); ok {
		cfg.Forget = c.ClearToken
	}
	r, err := csr.NewReaper(cfg)
	if err == nil {
		err = r.Run(ctx)
	}
	if err != nil && ctx.Err() == nil {
		log.Error("token reaper stopped; used tokens now live until their TTL", logkey.Error, err.Error())
	}
}
