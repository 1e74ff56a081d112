package join

import (
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"time"

	"github.com/latchkey/latchkey/internal/strictyaml"
)

// Redacted replaces secrets in a rendered configuration meant for eyes.
const Redacted = "<redacted>"

// check refuses a ticket kubeadm could not use, before anything runs.
func (t Ticket) check() error {
	if msg := nodeNameError(t.NodeName); msg != "" {
		return fmt.Errorf("join: node name %q: %s", t.NodeName, msg)
	}
	if !isToken(t.Token) {
		return fmt.Errorf("join: ticket carries no valid bootstrap token")
	}
	if len(t.Endpoints) == 0 {
		return fmt.Errorf("join: ticket names no API server endpoint")
	}
	if _, _, err := net.SplitHostPort(t.Endpoints[0]); err != nil {
		return fmt.Errorf("join: API server endpoint %q: %w", t.Endpoints[0], err)
	}
	if len(t.CACertHashes) == 0 {
		return fmt.Errorf("join: ticket carries no CA cert hash; refusing unpinned discovery")
	}
	for _, h := range t.CACertHashes {
		if !isPin(h) {
			return fmt.Errorf("join: CA cert hash %q is not sha256:<64 hex>", h)
		}
	}
	if t.ControlPlane && !isCertificateKey(t.CertificateKey) {
		return fmt.Errorf("join: control-plane ticket carries no valid certificate key")
	}
	if len(t.CABundle) > 0 {
		return checkBundle(t.CABundle, t.CACertHashes)
	}
	return nil
}

// maxCABundle bounds the CA bundle a ticket may carry.
const maxCABundle = 64 << 10

// checkBundle accepts a CA bundle only if it holds at least one
// certificate and every certificate in it is pinned by the ticket's CA
// hashes: the bundle is what kubelet will trust for the API server, so an
// unpinned extra CA is refused, not ignored.
func checkBundle(bundle []byte, pins []string) error {
	if len(bundle) > maxCABundle {
		return fmt.Errorf("join: ticket CA bundle is %d bytes, more than %d", len(bundle), maxCABundle)
	}
	certs, err := parseCertsPEM(bundle)
	if err != nil {
		return fmt.Errorf("join: ticket CA bundle: %w", err)
	}
	for _, c := range certs {
		if p := pin(c); !slices.Contains(pins, p) {
			return fmt.Errorf("join: ticket CA bundle holds %q (%s), which no CA cert hash pins", c.Subject.CommonName, p)
		}
	}
	return nil
}

// discoveryKubeconfig is kubeadm's file discovery input: the API server
// and the pinned CA bundle, no credentials (the token is the
// JoinConfiguration's tlsBootstrapToken).
func discoveryKubeconfig(t Ticket) ([]byte, error) {
	const name = "latchkey"
	kc := kubeconfig{
		APIVersion:     "v1",
		Kind:           "Config",
		Clusters:       []namedCluster{{Name: name, Cluster: cluster{Server: "https://" + t.Endpoints[0], CertificateAuthorityData: t.CABundle}}},
		AuthInfos:      []namedAuthInfo{{Name: name}},
		Contexts:       []namedContext{{Name: name, Context: kubeContext{Cluster: name, AuthInfo: name}}},
		CurrentContext: name,
	}
	out, err := strictyaml.Marshal(kc)
	if err != nil {
		return nil, fmt.Errorf("join: render discovery kubeconfig: %w", err)
	}
	return out, nil
}

// discovery is file discovery when the ticket carries the CA bundle (no
// cluster-info signature needed: the bundle came over the attested,
// pinned session), and kubeadm's token discovery otherwise.
func discovery(t Ticket, discoveryFile string) joinDiscovery {
	if len(t.CABundle) > 0 {
		return joinDiscovery{File: &fileDiscovery{KubeConfigPath: discoveryFile}, TLSBootstrapToken: t.Token}
	}
	return joinDiscovery{BootstrapToken: &bootstrapTokenDiscovery{
		Token: t.Token, APIServerEndpoint: t.Endpoints[0], CACertHashes: t.CACertHashes}}
}

// config builds the kubeadm JoinConfiguration for t; discoveryFile is
// where the discovery kubeconfig of file discovery is written.
func (j *Joiner) config(t Ticket, discoveryFile string) *joinConfiguration {
	c := &joinConfiguration{
		APIVersion: kubeadmAPIVersion,
		Kind:       "JoinConfiguration",
		NodeRegistration: nodeRegistration{
			Name:                  t.NodeName,
			CRISocket:             j.cfg.CRISocket,
			IgnorePreflightErrors: j.cfg.IgnorePreflightErrors,
		},
		Discovery: discovery(t, discoveryFile),
	}
	if t.ControlPlane {
		c.ControlPlane = &joinControlPlane{
			LocalAPIEndpoint: apiEndpoint{AdvertiseAddress: j.cfg.AdvertiseAddress, BindPort: j.cfg.BindPort},
			CertificateKey:   t.CertificateKey,
		}
	}
	if j.cfg.DiscoveryTimeout > 0 || j.cfg.TLSBootstrapTimeout > 0 {
		c.Timeouts = &joinTimeouts{
			Discovery:    optDuration(j.cfg.DiscoveryTimeout),
			TLSBootstrap: optDuration(j.cfg.TLSBootstrapTimeout),
		}
	}
	return c
}

func optDuration(d time.Duration) *duration {
	if d <= 0 {
		return nil
	}
	v := duration(d)
	return &v
}

// Render returns the JoinConfiguration YAML for t, secrets included: it
// is what Join writes to its 0600 file. Never print it; use
// RenderRedacted for that.
func (j *Joiner) Render(t Ticket) ([]byte, error) {
	return j.render(t, j.discoveryPath(filepath.Join(j.cfg.Dir, "kubeadm-join.yaml")), false)
}

// RenderRedacted is Render with the token secret and the certificate key
// replaced by Redacted: the --dry-run output an operator may read and
// paste. The token ID stays, so the token can still be named.
func (j *Joiner) RenderRedacted(t Ticket) ([]byte, error) {
	return j.render(t, j.discoveryPath(filepath.Join(j.cfg.Dir, "kubeadm-join.yaml")), true)
}

func (j *Joiner) render(t Ticket, discoveryFile string, redact bool) ([]byte, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	if redact {
		t.Token = t.Token[:6] + "." + Redacted
		if t.ControlPlane {
			t.CertificateKey = Redacted
		}
	}
	out, err := strictyaml.Marshal(j.config(t, discoveryFile))
	if err != nil {
		return nil, fmt.Errorf("join: render JoinConfiguration: %w", err)
	}
	return out, nil
}
