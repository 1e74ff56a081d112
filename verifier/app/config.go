// Package app assembles a running latchkey-verifier from its configuration:
// serving certificate, master secret, policy store, token minter and the
// gRPC join service. cmd/latchkey-verifier only parses flags and calls it.
package app

import (
	"errors"
	"fmt"
	"os"

	"github.com/latchkey/latchkey/internal/strictyaml"

	"github.com/latchkey/latchkey/internal/duration"
	"github.com/latchkey/latchkey/internal/localapi"
	"github.com/latchkey/latchkey/internal/logging"
	"github.com/latchkey/latchkey/verifier/service"
)

// DefaultConfigPath is where serve looks for its config file.
const DefaultConfigPath = "/etc/latchkey/verifier.yaml"

// DefaultStateDir holds the self-managed serving key when systemd gives no
// $STATE_DIRECTORY.
const DefaultStateDir = "/var/lib/latchkey-verifier"

// Config is the verifier's configuration file. Every zero value is the
// secure one: no Kubernetes section is disk-only mode (no tokens), no
// metrics address serves no metrics.
type Config struct {
	// Listen is the join address (default ":7443"); ignored under socket
	// activation.
	Listen string `json:"listen,omitempty"`
	// StateDir holds tls.key/tls.crt when no certificate is configured
	// (default $STATE_DIRECTORY, else /var/lib/latchkey-verifier).
	StateDir string `json:"stateDir,omitempty"`
	// TLSCert and TLSKey name a configured serving certificate (PEM).
	TLSCert string `json:"tlsCert,omitempty"`
	TLSKey  string `json:"tlsKey,omitempty"`
	// Policy is the reference policy file (hot-reloaded).
	Policy string `json:"policy"`
	// PolicyNext is a candidate policy file, evaluated next to the
	// enforced one on every join and re-attestation for the audit line
	// (shadow_decision, shadow_reason) and a metric only; never enforced.
	// Hot-reloaded like policy. Empty evaluates none.
	PolicyNext string `json:"policyNext,omitempty"`
	// MasterSecretFile holds the master secret (default: the systemd
	// credential latchkey-master-secret in $CREDENTIALS_DIRECTORY).
	MasterSecretFile string `json:"masterSecretFile,omitempty"`
	// MasterSecrets lists every master-secret generation the verifier
	// serves, one current (secrets.go); mutually exclusive with
	// MasterSecretFile, which is generation 0.
	MasterSecrets []MasterSecret `json:"masterSecrets,omitempty"`
	// ClusterSalt is this cluster's public HKDF salt (required).
	ClusterSalt string `json:"clusterSalt"`
	// Kubernetes enables bootstrap tokens; absent means disk-only mode.
	Kubernetes *Kubernetes `json:"kubernetes,omitempty"`
	// SNPCollateralDir is the offline VCEK/ASK/ARK cache.
	SNPCollateralDir string `json:"snpCollateralDir,omitempty"`
	// MetricsListen serves Prometheus /metrics there ("" = off).
	MetricsListen string `json:"metricsListen,omitempty"`
	// AdminSocket is the local admin API socket (default
	// /run/latchkey/verifier/admin.sock; "-" disables it).
	AdminSocket string `json:"adminSocket,omitempty"`
	// JoinTimeout bounds one join (default 60s).
	JoinTimeout Duration `json:"joinTimeout,omitempty"`
	// Limits bound what unauthenticated clients can hold open.
	Limits Limits `json:"limits,omitempty"`
	// Identity configures the binding of disk UUIDs and node names to
	// attested machines.
	Identity Identity `json:"identity,omitempty"`
	// Reattest configures the taint controller of continuous
	// re-attestation (Kubernetes mode only).
	Reattest Reattest `json:"reattest,omitempty"`
	// Log sets the log level and format (log: {level, format});
	// --log-level and --log-format override it.
	Log logging.Config `json:"log,omitempty"`
}

// Limits bound the join port. Zero means the default; every default is
// far above what a real fleet needs of one replica.
type Limits struct {
	// MaxConnections in all (default 4096).
	MaxConnections int `json:"maxConnections,omitempty"`
	// MaxConnectionsPerSource from one IP address (default 256).
	MaxConnectionsPerSource int `json:"maxConnectionsPerSource,omitempty"`
	// MaxJoinsInFlight bounds the joins being validated, bound and issued
	// at once (default 8 x GOMAXPROCS). Past it a join is answered at once
	// with RESOURCE_EXHAUSTED and a retry-after hint derived from the
	// verifier's throughput (slots / mean slot time), instead of queueing until its
	// timeout; the last quarter of the slots is kept for sources (IP
	// addresses) below their fair share.
	MaxJoinsInFlight int `json:"maxJoinsInFlight,omitempty"`
	// ChallengeTimeout bounds each wait for a challenge answer (default
	// 5s, service.DefaultChallengeTimeout; at most joinTimeout). Before
	// the answer nothing proves the caller holds a TPM, so the wait is
	// short, and it holds no in-flight slot while a challenge-wait place
	// is free (maxJoinsInFlight/2 per source, 4 x maxJoinsInFlight in all).
	ChallengeTimeout Duration `json:"challengeTimeout,omitempty"`
}

// Identity configures identity binding (verifier/binding). Bindings are
// always enforced; these options only shape the upgrade path.
type Identity struct {
	// AdoptUnbound lets a rejoin whose disk UUID or node name has no
	// binding record (set up before identity binding) claim it for the
	// machine that attests. Turn it on for an upgrade, let every node
	// reboot once, and turn it off again. Off (the default) refuses such
	// a rejoin with IDENTITY_MISMATCH.
	AdoptUnbound bool `json:"adoptUnbound,omitempty"`
	// BindingDir holds the binding records in disk-only mode (default
	// <stateDir>/bindings). Kubernetes mode keeps them in Leases.
	BindingDir string `json:"bindingDir,omitempty"`
	// Etcd keeps the binding records of disk-only mode in an etcd cluster
	// that several replicas share (etcd.go); exclusive with BindingDir.
	Etcd *Etcd `json:"etcd,omitempty"`
}

// Reattest configures the re-attestation taint controller
// (verifier/reattest). The zero value taints (NoSchedule) a node whose
// latest re-attestation was refused or whose Lease is older than 30m.
type Reattest struct {
	// Deadline after which a node whose Lease was not renewed is stale
	// and tainted (default 30m, three agent intervals; at least 1s).
	Deadline Duration `json:"deadline,omitempty"`
	// Effect of the latchkey.io/unattested taint: NoSchedule (default),
	// NoExecute (evicts pods that do not tolerate it) or none
	// (report-only: metrics and log lines).
	Effect string `json:"effect,omitempty"`
	// OfflineEffect of the latchkey.io/unattested=offline taint a node
	// carries after it unlocked its disk offline, until a re-attestation
	// succeeds (docs/offline-unlock.md): NoSchedule (default), NoExecute
	// or none (report-only).
	OfflineEffect string `json:"offlineEffect,omitempty"`
	// Resync is how often the leading replica checks every node (default
	// 30s).
	Resync Duration `json:"resync,omitempty"`
}

// Kubernetes configures the token step.
type Kubernetes struct {
	// Kubeconfig is the verifier's narrow credential (default: the systemd
	// credential latchkey-kubeconfig).
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// APIServerEndpoints override what cluster-info advertises.
	APIServerEndpoints []string `json:"apiServerEndpoints,omitempty"`
	// CACertHashes override the pins computed from cluster-info.
	CACertHashes []string `json:"caCertHashes,omitempty"`
	// TokenTTL is the bootstrap token lifetime (default 30m).
	TokenTTL Duration `json:"tokenTTL,omitempty"`
	// Discovery is how agents find and trust the API server: "file"
	// (default: the ticket carries the CA bundle, tokens are for
	// authentication only) or "token" (kubeadm's token discovery: signing
	// tokens and a wait for their JWS on cluster-info).
	Discovery string `json:"discovery,omitempty"`
	// JWSWait bounds the wait for cluster-info's signature (default 30s);
	// token discovery only.
	JWSWait Duration `json:"jwsWait,omitempty"`
	// CertificatesDir is the control plane's PKI directory (kubeadm's
	// /etc/kubernetes/pki) whose shared certificates a control-plane join
	// receives, encrypted. Empty refuses control-plane joins.
	CertificatesDir string `json:"certificatesDir,omitempty"`
	// ApproveServingCertificates lets the verifier approve kubelet-serving
	// CSRs of nodes it attested (client CSRs are always checked).
	ApproveServingCertificates bool `json:"approveServingCertificates,omitempty"`
	// BindingNamespace holds the binding Leases (default latchkey-system,
	// created by verifier/deploy).
	BindingNamespace string `json:"bindingNamespace,omitempty"`
	// APIQPS and APIBurst are the verifier's client-side bound on its
	// requests to the API server (default DefaultAPIQPS and twice APIQPS);
	// the API server's priority and fairness applies besides. A whole join
	// costs about ten requests (binding claims, token write and record,
	// CSR approval, token deletion), so the bound caps joins per second at
	// about APIQPS/10 (docs/benchmarks.md, boot storm).
	APIQPS   float32 `json:"apiQPS,omitempty"`
	APIBurst int     `json:"apiBurst,omitempty"`
}

// DefaultAPIQPS is kubernetes.apiQPS's default.
const DefaultAPIQPS = 500

// Duration is a time.Duration written as "30s" in YAML.
type Duration = duration.Duration

// LoadConfig reads a config file strictly: unknown keys, duplicate keys
// and keys that match a field only case-insensitively are errors.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	var c Config
	if err := strictyaml.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return &c, nil
}

// Defaults fills the defaults of optional fields.
func (c *Config) Defaults() {
	if c.Listen == "" {
		c.Listen = ":7443"
	}
	if c.StateDir == "" {
		c.StateDir = os.Getenv("STATE_DIRECTORY")
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.AdminSocket == "" {
		c.AdminSocket = localapi.VerifierSocket
	}
}

// Validate fills defaults and checks required fields.
func (c *Config) Validate() error {
	c.Defaults()
	if err := c.Log.Validate(); err != nil {
		return fmt.Errorf("log: %w", err)
	}
	if c.Policy == "" {
		return errors.New("no policy file configured (policy: or --policy)")
	}
	if c.ClusterSalt == "" {
		return errors.New("no cluster salt configured (clusterSalt: or --cluster-salt)")
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return errors.New("tlsCert and tlsKey must be set together")
	}
	if err := c.validateMasterSecrets(); err != nil {
		return err
	}
	if err := c.validateReattest(); err != nil {
		return err
	}
	if err := c.validateEtcd(); err != nil {
		return err
	}
	if err := c.validateLimits(); err != nil {
		return err
	}
	if k := c.Kubernetes; k != nil && (k.APIQPS < 0 || k.APIBurst < 0) {
		return fmt.Errorf("kubernetes.apiQPS %v, apiBurst %d: want 0 (default) or more", k.APIQPS, k.APIBurst)
	}
	if k := c.Kubernetes; k != nil && k.Discovery != "" && k.Discovery != "file" && k.Discovery != "token" {
		return fmt.Errorf("kubernetes.discovery %q: want file or token", k.Discovery)
	}
	return nil
}

// validateLimits checks the limits that have a range: the challenge
// timeout is not negative and not longer than a whole join.
func (c *Config) validateLimits() error {
	ct, jt := c.Limits.ChallengeTimeout.Duration, c.JoinTimeout.Duration
	if jt <= 0 {
		jt = service.DefaultJoinTimeout
	}
	switch {
	case ct < 0:
		return fmt.Errorf("limits.challengeTimeout %s: want 0 (default %s) or more", ct, service.DefaultChallengeTimeout)
	case ct > jt:
		return fmt.Errorf("limits.challengeTimeout %s is longer than joinTimeout %s", ct, jt)
	}
	return nil
}
