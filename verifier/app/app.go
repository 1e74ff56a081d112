package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/latchkey/latchkey/attest/snp"
	"github.com/latchkey/latchkey/attest/snp/kubestore"
	"github.com/latchkey/latchkey/attest/tdx"
	"github.com/latchkey/latchkey/internal/localapi"
	"github.com/latchkey/latchkey/internal/logkey"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/adminapi"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/connlimit"
	"github.com/latchkey/latchkey/verifier/keys"
	"github.com/latchkey/latchkey/verifier/metrics"
	"github.com/latchkey/latchkey/verifier/policy"
	"github.com/latchkey/latchkey/verifier/service"
	"github.com/latchkey/latchkey/verifier/servingcert"
	"github.com/latchkey/latchkey/verifier/token"
)

// Deps are what the caller provides besides the config.
type Deps struct {
	Logger *slog.Logger
	// Listener replaces Listen (socket activation, tests).
	Listener net.Listener
	// Minter replaces the one built from the Kubernetes section (tests).
	Minter token.Minter
	// Bindings replaces the binding store (tests); by default Leases when
	// Kubernetes is configured, else a directory in the state directory.
	Bindings binding.Store
	// Ready is called once the listener serves; optional (sd_notify).
	Ready func()
}

// ErrConfig marks a failure of New that only the operator can fix (a
// missing or unreadable master secret, an invalid policy, an invalid
// configuration): the program exits 2, which the unit's
// RestartPreventExitStatus= covers, instead of being restarted every 5 s.
var ErrConfig = errors.New("bad configuration")

// Verifier is an assembled, not yet serving verifier.
type Verifier struct {
	cfg    *Config
	deps   Deps
	keys   *keys.Deriver
	store  *policy.Store
	next   *policy.Store // the candidate policy (policyNext, shadow.go); nil without
	grpc   *grpc.Server
	health *health.Server
	// Minter is the token step in use (nil in disk-only mode).
	Minter     token.Minter
	bindings   binding.Store
	kube       kubernetes.Interface
	metrics    *metrics.Metrics
	policyDeps policy.Deps
	// bg owns Serve's goroutines; Serve waits for them.
	bg background
	// revoker deletes the tokens of denied nodes (nil in disk-only mode).
	revoker *service.Revoker
}

// New loads everything serve needs and fails before listening if anything
// is wrong.
func New(cfg *Config, deps Deps) (*Verifier, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	v := &Verifier{cfg: cfg, deps: deps}
	if cfg.MetricsListen != "" {
		v.metrics = metrics.New()
	}
	if err := v.loadKeys(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	for _, step := range []struct {
		run    func() error
		config bool // a failure is the operator's to fix: restarting cannot help
	}{{v.checkStateDir, true}, {v.loadKube, false}, {v.loadBindings, false}, {v.loadPolicy, true}, {v.buildServer, false}} {
		if err := step.run(); err != nil {
			v.keys.Close()
			if step.config {
				err = fmt.Errorf("%w: %w", ErrConfig, err)
			}
			return nil, err
		}
	}
	v.metrics.SetReadyCheck(v.ready) // ops.go
	return v, nil
}

// loadKube builds the token step unless the verifier is disk-only.
func (v *Verifier) loadKube() error {
	v.Minter = v.deps.Minter
	if v.Minter != nil || v.cfg.Kubernetes == nil {
		return nil
	}
	var err error
	v.kube, v.Minter, err = newKubeMinter(v.cfg.Kubernetes, v.deps.Logger)
	return err
}

// loadBindings opens the binding store: Leases shared by every replica
// in Kubernetes mode; in disk-only mode an etcd cluster shared by every
// replica when identity.etcd is set, else a directory of the state
// directory (one replica).
func (v *Verifier) loadBindings() error {
	var err error
	switch {
	case v.deps.Bindings != nil:
		v.bindings = v.deps.Bindings
	case v.kube != nil:
		v.bindings, err = binding.NewLeases(binding.LeaseConfig{Client: v.kube,
			Namespace: v.cfg.Kubernetes.BindingNamespace, Logger: v.deps.Logger, TokenTTL: tokenTTL(v.cfg.Kubernetes),
			OnTokenReplaced: revokeReplaced(v.Minter, v.deps.Logger)})
	case v.cfg.Identity.Etcd != nil:
		v.bindings, err = newEtcdStore(v.cfg, v.deps, v.metrics.StoreRequest) // etcd.go
	default:
		dir := v.cfg.Identity.BindingDir
		if dir == "" {
			dir = filepath.Join(v.cfg.StateDir, "bindings")
		}
		v.bindings, err = binding.NewDir(binding.DirConfig{Dir: dir, Logger: v.deps.Logger})
	}
	return err
}

func (v *Verifier) loadKeys() error {
	var err error
	if v.keys, err = Deriver(v.cfg); err != nil {
		return err
	}
	if v.keys.SecretLooksLikeText() {
		v.deps.Logger.Warn("the master secret is text ending in a newline; the newline is part of the secret " +
			"(disk keys depend on every byte), so copy the file byte for byte to every replica and compare key_id")
	}
	v.logGenerations()
	return nil
}

func (v *Verifier) loadPolicy() error {
	coll, err := NewCollateral(v.cfg, v.kube, v.deps.Logger)
	if err != nil {
		return err
	}
	tdxColl, err := NewTDXCollateral(v.cfg, v.deps.Logger)
	if err != nil {
		return err
	}
	v.policyDeps = policy.Deps{SNPCollateral: coll, TDXCollateral: tdxColl}
	v.store, err = policy.NewStore(policy.StoreConfig{Path: v.cfg.Policy, Deps: v.policyDeps,
		Logger: v.deps.Logger, OnReload: v.onReload})
	if err != nil {
		return err
	}
	if err := v.loadPolicyNext(); err != nil {
		return err
	}
	v.metrics.PolicyLoaded(v.store.Current().Digest)
	v.deps.Logger.Info("policy loaded", logkey.Path, v.cfg.Policy, logkey.Policy, v.store.Current().Digest)
	return nil
}

func (v *Verifier) buildServer() error {
	cert, err := v.certificate()
	if err != nil {
		return err
	}
	if v.Minter != nil {
		v.revoker, err = service.NewRevoker(service.RevokerConfig{Policy: v.store, Bindings: v.bindings,
			Minter: v.Minter, Logger: v.deps.Logger, Metrics: v.metrics})
		if err != nil {
			return err
		}
	}
	svc, err := service.New(service.Config{Policy: v.store, Keys: v.keys, Minter: v.Minter,
		Bindings: v.bindings, AdoptUnbound: v.cfg.Identity.AdoptUnbound,
		Logger: v.deps.Logger, JoinTimeout: v.cfg.JoinTimeout.Duration, Metrics: v.metrics, Revoker: v.revoker,
		MaxInFlight: v.cfg.Limits.MaxJoinsInFlight, ChallengeTimeout: v.cfg.Limits.ChallengeTimeout.Duration,
		PolicyNext: v.policyNext(), Grants: v.grantSigner()})
	if err != nil {
		return err
	}
	v.grpc, v.health = service.NewGRPCServer(svc, cert)
	return nil
}

func (v *Verifier) certificate() (tls.Certificate, error) {
	cert, err := ServingCertificate(v.cfg)
	if err != nil {
		return cert, err
	}
	return cert, v.recordCertificate(cert) // ops.go
}

// ServingCertificate loads the configured certificate, or the self-managed
// one in the state directory (created on first use), exactly as serve
// does, so `latchkey-verifier pin` prints the pin that is served.
func ServingCertificate(cfg *Config) (tls.Certificate, error) {
	if cfg.TLSCert != "" {
		return servingcert.Load(cfg.TLSCert, cfg.TLSKey)
	}
	return servingcert.LoadOrCreate(cfg.StateDir, time.Now())
}

// NewCollateral is the SNP collateral cache of cfg: the offline directory,
// shared with every replica through a ConfigMap when Kubernetes is
// configured (kube non-nil). Nil when neither is there.
func NewCollateral(cfg *Config, kube kubernetes.Interface, log *slog.Logger) (*snp.Collateral, error) {
	if cfg.SNPCollateralDir == "" && kube == nil {
		return nil, nil
	}
	cc := snp.CollateralConfig{Dir: cfg.SNPCollateralDir, Logger: log}
	if kube != nil {
		store, err := kubestore.New(kubestore.Config{Client: kube, Namespace: "kube-system"})
		if err != nil {
			return nil, fmt.Errorf("snp collateral: %w", err)
		}
		cc.Store = store
	}
	c, err := snp.NewCollateral(cc)
	if err != nil {
		return nil, fmt.Errorf("snp collateral: %w", err)
	}
	return c, nil
}

// NewTDXCollateral is the TDX collateral cache of cfg (its offline
// directory), nil when none is configured.
func NewTDXCollateral(cfg *Config, log *slog.Logger) (*tdx.Collateral, error) {
	if cfg.TDXCollateralDir == "" {
		return nil, nil
	}
	c, err := tdx.NewCollateral(tdx.CollateralConfig{Dir: cfg.TDXCollateralDir, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("tdx collateral: %w", err)
	}
	return c, nil
}

// Serve listens and serves until ctx ends, then stops gracefully: joins in
// flight finish (or hit their own timeout), new ones are refused.
func (v *Verifier) Serve(ctx context.Context) error {
	// Deferred in reverse: stop the admin API, end the context, wait for
	// every background goroutine, and only then wipe the master secret.
	defer v.keys.Close()
	defer v.bg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	mlis, lis, stopAdmin, err := v.bind() // ops.go
	if err != nil {
		return err
	}
	defer stopAdmin()
	v.bg.Go(func() { v.store.Run(ctx) })
	if v.next != nil {
		v.bg.Go(func() { v.next.Run(ctx) })
	}
	v.bg.Go(func() { v.serveMetrics(ctx, mlis) })
	v.bg.Go(func() { v.countGenerations(ctx) }) // secrets.go
	if v.revoker != nil {
		v.bg.Go(func() { v.revoker.Run(ctx) })
	}
	if v.kube != nil {
		// One factory: the approver and the reaper share its CSR watch.
		f := informers.NewSharedInformerFactory(v.kube, controllerResync)
		v.bg.Go(func() {
			<-ctx.Done()
			f.Shutdown()
		})
		v.bg.Go(func() { runApprover(ctx, v.kube, f, v.bindings, v.store, v.cfg.Kubernetes, v.deps.Logger) })
		v.bg.Go(func() { runReaper(ctx, v.kube, f, v.Minter, v.bindings, v.metrics, v.deps.Logger) })
		// The controller reads the nodes' Leases: only with that store.
		if leases, ok := v.bindings.(*binding.Leases); ok {
			v.bg.Go(func() { v.runReattest(ctx, leases) })
		}
	}
	errc := make(chan error, 1)
	v.bg.Go(func() { errc <- v.grpc.Serve(lis) })
	v.deps.Logger.Info("verifier serving", logkey.Address, lis.Addr().String(), logkey.DiskOnly, v.Minter == nil)
	if v.cfg.Identity.AdoptUnbound {
		v.deps.Logger.Warn("identity.adoptUnbound is on: a rejoin whose disk or node name has no binding record claims it; turn it off once every node has rejoined")
	}
	if v.deps.Ready != nil {
		v.deps.Ready()
	}
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	v.health.Shutdown()
	v.gracefulStop()
	return nil
}

func (v *Verifier) gracefulStop() {
	done := make(chan struct{})
	go func() { v.grpc.GracefulStop(); close(done) }()
	limit := v.cfg.JoinTimeout.Duration
	if limit <= 0 {
		limit = service.DefaultJoinTimeout
	}
	select {
	case <-done:
	case <-time.After(limit + 5*time.Second):
		v.grpc.Stop()
	}
	v.deps.Logger.Info("verifier stopped")
}

// listener is the join port (given, socket-activated or opened here),
// bounded by the connection limits.
func (v *Verifier) listener() (net.Listener, error) {
	lis := v.deps.Listener
	if lis == nil {
		var err error
		if lis, err = net.Listen("tcp", v.cfg.Listen); err != nil {
			return nil, fmt.Errorf("%w: listen %s: %w", ErrConfig, v.cfg.Listen, err)
		}
	}
	return v.watchHandshakes(connlimit.Wrap(lis, connlimit.Config{
		MaxConnections:          v.cfg.Limits.MaxConnections,
		MaxConnectionsPerSource: v.cfg.Limits.MaxConnectionsPerSource,
		OnRefused:               v.metrics.ConnectionRefused,
	})), nil
}

func (v *Verifier) onReload(digest string, err error) {
	if err != nil {
		v.metrics.PolicyReloadFailed()
		return
	}
	v.metrics.PolicyLoaded(digest)
	if v.revoker != nil {
		v.revoker.Kick() // a new deny entry takes its node's token back now
	}
}

// serveAdmin serves the local admin API ("-" disables it). The socket is
// 0660: the verifier's own (dynamic) user and group, and root, may
// connect; the peer-credential check in the transport handshake admits
// root only.
func (v *Verifier) serveAdmin() (func(), error) {
	if v.cfg.AdminSocket == "-" {
		return func() {}, nil
	}
	var tokens adminapi.Tokens // nil in disk-only mode
	if v.kube != nil {
		tokens = tokenAdmin{client: v.kube, minter: v.Minter, bindings: v.bindings}
	}
	srv, err := localapi.NewServer(localapi.Config{Logger: v.deps.Logger,
		Services: []localapi.Service{adminapi.Service(tokens, policyChecker{v.policyDeps}, bindingAdmin{store: v.bindings, policy: v.store})}})
	var lis net.Listener
	if err == nil {
		lis, err = localapi.Listen(localapi.SocketConfig{Path: v.cfg.AdminSocket, Mode: 0o660})
	}
	if err != nil {
		return nil, fmt.Errorf("%w: adminSocket %s: %w", ErrConfig, v.cfg.AdminSocket, err)
	}
	v.bg.Go(func() { _ = srv.Serve(lis) })
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Stop(ctx)
	}, nil
}

// Healthy reports whether the join service is serving (the watchdog asks).
func (v *Verifier) Healthy(ctx context.Context) error {
	resp, err := v.health.Check(ctx, &healthpb.HealthCheckRequest{Service: latchkeyv1.JoinService_ServiceDesc.ServiceName})
	if err != nil {
		return err
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("join service is %s", resp.GetStatus())
	}
	return nil
}
