package token

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"

	"github.com/latchkey/latchkey/internal/boundedmap"
	"github.com/latchkey/latchkey/internal/logkey"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// Defaults of KubeConfig.
const (
	DefaultTTL           = 30 * time.Minute
	DefaultSignatureWait = 30 * time.Second
	// ClusterInfoMaxAge is how long file discovery reuses one read of
	// cluster-info: in a boot storm one read a second instead of one per
	// mint, at the cost of a CA bundle or endpoint change reaching
	// tickets up to that much later.
	ClusterInfoMaxAge = time.Second
	// revokeTimeout bounds the clean-up of a mint that failed after its
	// token Secret was written; it runs on a fresh context because the
	// mint's own may be the reason it failed.
	revokeTimeout = 10 * time.Second
)

// Errors a caller maps to a refusal reason.
var (
	// ErrBadRequest: the request names no valid node or role (MALFORMED).
	ErrBadRequest = errors.New("bad token request")
	// ErrControlPlaneDisabled: a control-plane token was asked of a minter
	// configured without the control-plane certificates (ROLE_NOT_ALLOWED).
	ErrControlPlaneDisabled = errors.New("control-plane tokens are not enabled")
	// ErrNotSigned: the bootstrap signer did not sign cluster-info with the
	// token in time (UNAVAILABLE); the token was deleted.
	ErrNotSigned = errors.New("cluster-info not signed with the new token in time")
)

// KubeConfig configures the Kubernetes minter. The zero value of every
// option is the safe one.
type KubeConfig struct {
	// Client is the verifier's narrow credential (verifier/deploy).
	Client kubernetes.Interface
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// Rand is the randomness of token IDs and secrets; crypto/rand when nil.
	Rand io.Reader
	// Logger receives one line per mint and revoke; slog.Default when nil.
	Logger *slog.Logger
	// TTL is the token lifetime; DefaultTTL when zero. The tokencleaner
	// reaps the Secret after it.
	TTL time.Duration
	// SignatureWait bounds the wait for the token's JWS signature on
	// cluster-info; DefaultSignatureWait when zero.
	SignatureWait time.Duration
	// Endpoints are the API servers ("host:port") a ticket names; when
	// empty, the server cluster-info publishes.
	Endpoints []string
	// CACertHashes are the "sha256:<hex>" CA pins a ticket names; when
	// empty, the pins of every CA in cluster-info's trust bundle.
	CACertHashes []string
	// TokenDiscovery mints signing tokens and waits for their JWS on
	// cluster-info, for agents that run kubeadm's token discovery. By
	// default tokens are for authentication only and the ticket carries
	// the CA bundle for file discovery: no cluster-info rewrite per node,
	// no signature wait.
	TokenDiscovery bool
	// CertificatesDir is the control plane's PKI directory (kubeadm's
	// /etc/kubernetes/pki), whose shared certificates a control-plane
	// token's ticket may fetch. Empty refuses control-plane tokens.
	CertificatesDir string
	// Authenticates, when set, reports whether the API server already
	// authenticates a token ("id.secret"; NewAuthenticates asks it): Mint
	// then returns a ticket only once it does, or after UsableWait. Nil
	// waits for nothing.
	Authenticates func(ctx context.Context, token string) (bool, error)
	// UsableWait bounds that wait; DefaultUsableWait when zero.
	UsableWait time.Duration
}

// Kube mints kubeadm bootstrap tokens on a Kubernetes cluster.
type Kube struct {
	cfg KubeConfig
	log *slog.Logger

	// info is the last cluster-info read for file discovery; infoMu is
	// held across a refresh, so concurrent mints share one read.
	infoMu sync.Mutex
	info   *corev1.ConfigMap
	infoAt time.Time

	// workers are the worker tokens this process minted and has not
	// revoked: such a token never owns kubeadm-certs, so revoking it skips
	// that Secret's read.
	workers *boundedmap.Map[string, struct{}]
}

var _ Minter = (*Kube)(nil)

// NewKube checks cfg and fills its defaults.
func NewKube(cfg KubeConfig) (*Kube, error) {
	if cfg.Client == nil {
		return nil, errors.New("token: no Kubernetes client")
	}
	if cfg.TTL < 0 || cfg.SignatureWait < 0 || cfg.UsableWait < 0 {
		return nil, errors.New("token: negative TTL, signature wait or usable wait")
	}
	if cfg.UsableWait == 0 {
		cfg.UsableWait = DefaultUsableWait
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.SignatureWait == 0 {
		cfg.SignatureWait = DefaultSignatureWait
	}
	if _, err := bundlePinsFromConfig(cfg.CACertHashes); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Kube{cfg: cfg, log: log.With(logkey.Component, "token"),
		workers: boundedmap.New[string, struct{}](maxMintedWorkers)}, nil
}

// bundlePinsFromConfig checks configured pins have kubeadm's format.
func bundlePinsFromConfig(pins []string) ([]string, error) {
	for _, p := range pins {
		if len(p) != len("sha256:")+64 || p[:7] != "sha256:" {
			return nil, fmt.Errorf("token: CA cert hash %q is not sha256:<64 hex>", p)
		}
	}
	return pins, nil
}

// Mint writes a bootstrap token for req, uploads the control-plane
// certificates for a control-plane request, and reads what discovery
// needs from cluster-info (with TokenDiscovery, once it is signed with
// the token). Any failure after the Secret was written
// deletes it again, so a failed mint leaves nothing behind.
func (k *Kube) Mint(ctx context.Context, req Request) (*Grant, error) {
	if err := validateRequest(req); err != nil {
		return nil, err
	}
	cp := req.Role == latchkeyv1.Role_ROLE_CONTROL_PLANE
	if cp && k.cfg.CertificatesDir == "" {
		return nil, ErrControlPlaneDisabled
	}
	start := k.cfg.Now()
	expiry := start.Add(k.cfg.TTL)
	created, secret, err := k.createSecret(ctx, req, expiry)
	if err != nil {
		return nil, err
	}
	id := string(created.Data[bootstrapapi.BootstrapTokenIDKey])
	var recorded chan error
	if req.Record != nil {
		recorded = make(chan error, 1)
		go func() { recorded <- req.Record(ctx, id) }()
	}
	g, err := k.complete(ctx, created, id, secret, cp)
	if recorded != nil {
		if rerr := <-recorded; rerr != nil && err == nil {
			err = fmt.Errorf("record token: %w", rerr)
		}
	}
	if err != nil {
		k.rollback(id, err)
		return nil, err
	}
	g.Expiry = expiry
	k.waitUsable(ctx, g)
	if !cp {
		k.workers.Put(id, struct{}{})
	}
	k.log.Info("token minted", logkey.TokenID, id, logkey.Node, req.NodeName, logkey.Role, roleLabel(req.Role),
		logkey.EvidenceDigest, req.EvidenceDigest, logkey.Expiry, expiry.UTC().Format(time.RFC3339))
	return g, nil
}

// createSecret writes the token Secret, drawing a new ID in the unlikely
// case that one is taken. It returns the stored Secret and the secret.
func (k *Kube) createSecret(ctx context.Context, req Request, expiry time.Time) (*corev1.Secret, string, error) {
	secrets := k.cfg.Client.CoreV1().Secrets(metav1.NamespaceSystem)
	for range 3 {
		id, secret, err := newTokenPair(k.cfg.Rand)
		if err != nil {
			return nil, "", err
		}
		created, err := secrets.Create(ctx, bootstrapSecret(id, secret, req, expiry, k.cfg.TokenDiscovery), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			return nil, "", fmt.Errorf("create token secret: %w", err)
		}
		return created, secret, nil
	}
	return nil, "", errors.New("create token secret: token IDs keep colliding")
}

// complete does the steps after the Secret write: certificates, the
// signature wait and the ticket's endpoints and pins.
func (k *Kube) complete(ctx context.Context, created *corev1.Secret, id, secret string, cp bool) (*Grant, error) {
	g := &Grant{ID: id, Token: id + "." + secret}
	if cp {
		key, err := uploadCerts(ctx, k.cfg.Client, k.cfg.CertificatesDir, created)
		if err != nil {
			return nil, err
		}
		g.CertificateKey = key
	}
	cm, err := k.clusterInfo(ctx, id, secret)
	if err != nil {
		return nil, err
	}
	g.Endpoints, g.CACertHashes = k.cfg.Endpoints, k.cfg.CACertHashes
	var info clusterInfo
	if !k.cfg.TokenDiscovery || len(g.Endpoints) == 0 || len(g.CACertHashes) == 0 {
		if info, err = parseClusterInfo(cm); err != nil {
			return nil, err
		}
	}
	if len(g.Endpoints) == 0 {
		g.Endpoints = info.endpoints
	}
	if len(g.CACertHashes) == 0 {
		g.CACertHashes = info.caHashes
	}
	if len(g.CACertHashes) == 0 {
		return nil, errors.New("cluster-info publishes no CA certificate")
	}
	if !k.cfg.TokenDiscovery {
		if g.CABundle, err = pinnedBundle(info.bundle, g.CACertHashes); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// clusterInfo reads cluster-info: at once for file discovery, or once the
// bootstrap signer has signed it with this token for token discovery.
func (k *Kube) clusterInfo(ctx context.Context, id, secret string) (*corev1.ConfigMap, error) {
	if !k.cfg.TokenDiscovery {
		return k.cachedClusterInfo(ctx)
	}
	wctx, cancel := context.WithTimeout(ctx, k.cfg.SignatureWait)
	defer cancel()
	cm, err := waitSigned(wctx, k.cfg.Client, id, secret)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return nil, fmt.Errorf("%w (waited %s)", ErrNotSigned, k.cfg.SignatureWait)
		}
		return nil, fmt.Errorf("wait for cluster-info signature: %w", err)
	}
	return cm, nil
}

// cachedClusterInfo returns cluster-info as read at most
// ClusterInfoMaxAge ago, reading it when older. ResourceVersion "0" is
// served from the API server's watch cache: a read costs etcd nothing.
func (k *Kube) cachedClusterInfo(ctx context.Context) (*corev1.ConfigMap, error) {
	k.infoMu.Lock()
	defer k.infoMu.Unlock()
	now := k.cfg.Now()
	if k.info != nil && now.Sub(k.infoAt) < ClusterInfoMaxAge && !now.Before(k.infoAt) {
		return k.info, nil
	}
	cm, err := k.cfg.Client.CoreV1().ConfigMaps(metav1.NamespacePublic).Get(ctx,
		bootstrapapi.ConfigMapClusterInfo, metav1.GetOptions{ResourceVersion: "0"})
	if err != nil {
		return nil, fmt.Errorf("read cluster-info: %w", err)
	}
	k.info, k.infoAt = cm, now
	return cm, nil
}

// rollback deletes a token whose mint failed after the Secret was written.
func (k *Kube) rollback(id string, cause error) {
	ctx, cancel := context.WithTimeout(context.Background(), revokeTimeout)
	defer cancel()
	if err := k.Revoke(ctx, id); err != nil {
		k.log.Error("failed mint left a token behind", logkey.TokenID, id, logkey.Cause, cause, logkey.Error, err)
		return
	}
	k.log.Warn("mint failed, token deleted", logkey.TokenID, id, logkey.Cause, cause)
}

// Revoke deletes the token Secret and the kubeadm-certs Secret it owns.
// A token that is already gone (revoked, or reaped by the tokencleaner)
// is not an error.
func (k *Kube) Revoke(ctx context.Context, id string) error {
	_, err := k.RevokePresent(ctx, id)
	return err
}

// RevokePresent is Revoke that also tells whether the token Secret was
// still there to delete (false: already gone), for callers that count
// deletions (the token reaper) without the right to read Secrets.
func (k *Kube) RevokePresent(ctx context.Context, id string) (bool, error) {
	if !ValidID(id) {
		return false, fmt.Errorf("%w: token ID %q", ErrBadRequest, id)
	}
	name := SecretName(id)
	bg := metav1.DeletePropagationBackground
	err := k.cfg.Client.CoreV1().Secrets(metav1.NamespaceSystem).Delete(ctx, name,
		metav1.DeleteOptions{PropagationPolicy: &bg})
	if err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("delete token secret: %w", err)
	}
	// Only a control-plane token owns kubeadm-certs; one this process
	// minted as a worker's cannot.
	if _, mine := k.workers.Take(id); !mine {
		if err := deleteOwnedCerts(ctx, k.cfg.Client, name); err != nil {
			return false, fmt.Errorf("delete certificates of token %s: %w", id, err)
		}
	}
	k.log.Info("token revoked", logkey.TokenID, id, logkey.Present, err == nil)
	return err == nil, nil
}

// maxMintedWorkers bounds the worker tokens a minter remembers; past it,
// an arbitrary one is forgotten, and revoking that one reads
// kubeadm-certs as any token minted elsewhere does.
const maxMintedWorkers = 16384
