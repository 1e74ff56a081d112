// Package join is the agent's last boot stage: it turns a ticket into a
// kubeadm JoinConfiguration (kubeadm's v1beta4 wire format), writes it
// to a 0600 file under /run, runs `kubeadm join --config` and removes the
// file again. A failed join is undone with `kubeadm reset -f` so the next
// attempt, with a fresh ticket, starts from a clean node.
//
// Whether the node needs to join at all, and how often a failed join is
// retried, is the boot's decision (agent/boot), not this stage's.
package join

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/latchkey/latchkey/internal/execx"
	"github.com/latchkey/latchkey/internal/logkey"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// Defaults of Config.
const (
	DefaultDir     = "/run/latchkey"
	DefaultKubeadm = "kubeadm"
)

// Config configures the join stage. The zero value (plus a Runner) joins
// a worker with kubeadm's defaults.
type Config struct {
	// Runner runs kubeadm (required).
	Runner execx.Runner
	// Logger receives kubeadm's output line by line; slog.Default if nil.
	Logger *slog.Logger
	// Kubeadm is the kubeadm program; DefaultKubeadm when empty.
	Kubeadm string
	// Dir holds the JoinConfiguration while kubeadm runs; DefaultDir when
	// empty. It is created 0700.
	Dir string
	// DiscoveryTimeout bounds kubeadm's discovery (its JoinConfiguration
	// timeouts.discovery); kubeadm's default (5m) when zero.
	DiscoveryTimeout time.Duration
	// TLSBootstrapTimeout bounds the kubelet's TLS bootstrap, which waits
	// for the verifier to approve the node's CSR; kubeadm's default when zero.
	TLSBootstrapTimeout time.Duration
	// CRISocket is the container runtime endpoint; kubeadm detects it when
	// empty.
	CRISocket string
	// CRIWait bounds how long a real join waits for CRISocket (a unix://
	// endpoint) to accept connections before kubeadm runs; DefaultCRIWait
	// when zero. No wait without CRISocket or in dry-run mode.
	CRIWait time.Duration
	// IgnorePreflightErrors are passed to kubeadm as they are.
	IgnorePreflightErrors []string
	// AdvertiseAddress and BindPort are this node's API server endpoint
	// for a control-plane join (kubeadm picks when empty / zero).
	AdvertiseAddress string
	BindPort         int32
	// DryRun runs `kubeadm join --dry-run`: real discovery against the
	// cluster, no change to this node, and no reset afterwards.
	DryRun bool
}

// Ticket is what the join needs from the verifier's ticket.
type Ticket struct {
	NodeName string
	// Endpoints are "host:port"; kubeadm is given the first.
	Endpoints []string
	// Token is "<id>.<secret>". Never logged.
	Token        string
	CACertHashes []string
	// ControlPlane asks for `kubeadm join --control-plane`;
	// CertificateKey decrypts the shared certificates. Never logged.
	ControlPlane   bool
	CertificateKey string
	// CABundle is the PEM of the cluster CAs for file discovery (every
	// certificate pinned by CACertHashes); empty means token discovery.
	CABundle []byte
}

// TicketFrom takes the join's part of a protocol ticket.
func TicketFrom(node string, role latchkeyv1.Role, t *latchkeyv1.Ticket) Ticket {
	return Ticket{
		NodeName:       node,
		Endpoints:      append([]string(nil), t.GetApiServerEndpoints()...),
		Token:          t.GetToken(),
		CACertHashes:   append([]string(nil), t.GetCaCertHashes()...),
		ControlPlane:   role == latchkeyv1.Role_ROLE_CONTROL_PLANE,
		CertificateKey: t.GetCertificateKey(),
		CABundle:       append([]byte(nil), t.GetCaBundle()...),
	}
}

// Joiner runs kubeadm join.
type Joiner struct {
	cfg Config
	log *slog.Logger
}

// New checks cfg and fills its defaults.
func New(cfg Config) (*Joiner, error) {
	if cfg.Runner == nil {
		return nil, errors.New("join: no command runner")
	}
	if cfg.DiscoveryTimeout < 0 || cfg.TLSBootstrapTimeout < 0 || cfg.CRIWait < 0 {
		return nil, errors.New("join: negative timeout")
	}
	if cfg.Kubeadm == "" {
		cfg.Kubeadm = DefaultKubeadm
	}
	if cfg.CRIWait == 0 {
		cfg.CRIWait = DefaultCRIWait
	}
	if cfg.Dir == "" {
		cfg.Dir = DefaultDir
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Joiner{cfg: cfg, log: log.With(logkey.Stage, "join")}, nil
}

// Join runs one `kubeadm join` with t, and `kubeadm reset -f` when it
// fails (except in dry-run mode, which changes nothing).
func (j *Joiner) Join(ctx context.Context, t Ticket) error {
	path, err := j.newConfigPath()
	if err != nil {
		return err
	}
	cfgYAML, err := j.render(t, j.discoveryPath(path), false)
	if err != nil {
		return err
	}
	defer clear(cfgYAML)
	if err := j.writeFile(path, cfgYAML); err != nil {
		return err
	}
	defer j.removeConfig(path)
	if len(t.CABundle) > 0 {
		// The discovery kubeconfig holds no secret (the CA bundle and the
		// endpoint), but it is written 0600 and removed like the rest.
		kc, err := discoveryKubeconfig(t)
		if err != nil {
			return err
		}
		if err := j.writeFile(j.discoveryPath(path), kc); err != nil {
			return err
		}
		defer j.removeConfig(j.discoveryPath(path))
	}
	env, cleanup, err := j.dryRunEnv()
	if err != nil {
		return err
	}
	defer cleanup()
	if err := j.waitCRI(ctx); err != nil {
		return err
	}
	j.log.Info("running kubeadm join", logkey.Node, t.NodeName, logkey.Endpoint, t.Endpoints[0],
		logkey.ControlPlane, t.ControlPlane, logkey.DryRun, j.cfg.DryRun)
	err = j.kubeadm(ctx, j.joinArgs(path, t.ControlPlane), env...)
	if err == nil {
		j.log.Info("kubeadm join succeeded", logkey.Node, t.NodeName)
		return nil
	}
	if !j.cfg.DryRun {
		j.reset(ctx)
	}
	return fmt.Errorf("join: kubeadm join: %w", err)
}

// dryRunEnv gives a dry run a private directory for the files kubeadm
// "would write" (the bootstrap kubeconfig among them holds the token),
// instead of its default under /etc/kubernetes, and removes it afterwards.
func (j *Joiner) dryRunEnv() ([]string, func(), error) {
	if !j.cfg.DryRun {
		return nil, func() {}, nil
	}
	if err := os.MkdirAll(j.cfg.Dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("join: create %s: %w", j.cfg.Dir, err)
	}
	dir, err := os.MkdirTemp(j.cfg.Dir, "kubeadm-dry-run-")
	if err != nil {
		return nil, nil, fmt.Errorf("join: %w", err)
	}
	cleanup := func() {
		if err := os.RemoveAll(dir); err != nil {
			j.log.Error("could not remove the dry-run directory", logkey.Path, dir, logkey.Error, err)
		}
	}
	return []string{"KUBEADM_JOIN_DRYRUN_DIR=" + dir}, cleanup, nil
}

func (j *Joiner) joinArgs(path string, controlPlane bool) []string {
	args := []string{"join", "--config", path}
	if controlPlane {
		args = append(args, "--control-plane")
	}
	if j.cfg.DryRun {
		args = append(args, "--dry-run")
	}
	return args
}

// reset undoes a failed join; its own failure is logged, not returned,
// so the caller sees why the join failed.
func (j *Joiner) reset(ctx context.Context) {
	args := []string{"reset", "-f"}
	if j.cfg.CRISocket != "" {
		args = append(args, "--cri-socket", j.cfg.CRISocket)
	}
	if err := j.kubeadm(context.WithoutCancel(ctx), args); err != nil {
		j.log.Error("kubeadm reset after a failed join failed", logkey.Error, err)
	}
}

// kubeadm runs one kubeadm command and logs its output line by line.
func (j *Joiner) kubeadm(ctx context.Context, args []string, env ...string) error {
	res, err := j.cfg.Runner.Run(ctx, execx.Cmd{Name: j.cfg.Kubeadm, Args: args, Env: env})
	logLines(j.log, args[0], "stdout", res.Stdout)
	logLines(j.log, args[0], "stderr", res.Stderr)
	return err
}

// logLines sends each line of out to log as one record.
func logLines(log *slog.Logger, cmd, stream string, out []byte) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() {
		if line := bytes.TrimSpace(sc.Bytes()); len(line) > 0 {
			log.Info("kubeadm "+cmd, logkey.Stream, stream, logkey.Line, string(line))
		}
	}
}

// newConfigPath draws the random name of this join's files: the
// JoinConfiguration and, beside it (discoveryPath), the discovery
// kubeconfig it names.
func (j *Joiner) newConfigPath() (string, error) {
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return "", fmt.Errorf("join: %w", err)
	}
	return filepath.Join(j.cfg.Dir, "kubeadm-join-"+hex.EncodeToString(rnd[:])+".yaml"), nil
}

// discoveryPath is the discovery kubeconfig beside the config at path.
func (j *Joiner) discoveryPath(path string) string {
	return strings.TrimSuffix(path, ".yaml") + "-discovery.conf"
}

// writeFile writes data to a new 0600 file.
func (j *Joiner) writeFile(path string, data []byte) error {
	if err := os.MkdirAll(j.cfg.Dir, 0o700); err != nil {
		return fmt.Errorf("join: create %s: %w", j.cfg.Dir, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("join: %w", err)
	}
	_, werr := f.Write(data)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		j.removeConfig(path)
		return fmt.Errorf("join: write %s: %w", path, werr)
	}
	return nil
}

func (j *Joiner) removeConfig(path string) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		j.log.Error("could not remove the join configuration", logkey.Path, path, logkey.Error, err)
	}
}
