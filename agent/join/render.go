package join

import (
	"fmt"
	"net"
	"regexp"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	kubeadm "k8s.io/kubernetes/cmd/kubeadm/app/apis/kubeadm/v1beta4"
	"sigs.k8s.io/yaml"
)

// Redacted replaces secrets in a rendered configuration meant for eyes.
const Redacted = "<redacted>"

var (
	tokenRE   = regexp.MustCompile(`^([a-z0-9]{6})\.([a-z0-9]{16})$`)
	pinRE     = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	certKeyRE = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// check refuses a ticket kubeadm could not use, before anything runs.
func (t Ticket) check() error {
	if errs := validation.IsDNS1123Subdomain(t.NodeName); len(errs) > 0 {
		return fmt.Errorf("join: node name %q: %s", t.NodeName, strings.Join(errs, "; "))
	}
	if !tokenRE.MatchString(t.Token) {
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
		if !pinRE.MatchString(h) {
			return fmt.Errorf("join: CA cert hash %q is not sha256:<64 hex>", h)
		}
	}
	if t.ControlPlane && !certKeyRE.MatchString(t.CertificateKey) {
		return fmt.Errorf("join: control-plane ticket carries no valid certificate key")
	}
	return nil
}

// config builds the kubeadm JoinConfiguration for t.
func (j *Joiner) config(t Ticket) *kubeadm.JoinConfiguration {
	c := &kubeadm.JoinConfiguration{
		TypeMeta: metav1.TypeMeta{APIVersion: kubeadm.SchemeGroupVersion.String(), Kind: "JoinConfiguration"},
		NodeRegistration: kubeadm.NodeRegistrationOptions{
			Name:                  t.NodeName,
			CRISocket:             j.cfg.CRISocket,
			IgnorePreflightErrors: j.cfg.IgnorePreflightErrors,
		},
		Discovery: kubeadm.Discovery{
			BootstrapToken: &kubeadm.BootstrapTokenDiscovery{
				Token:             t.Token,
				APIServerEndpoint: t.Endpoints[0],
				CACertHashes:      t.CACertHashes,
			},
		},
	}
	if t.ControlPlane {
		c.ControlPlane = &kubeadm.JoinControlPlane{
			LocalAPIEndpoint: kubeadm.APIEndpoint{AdvertiseAddress: j.cfg.AdvertiseAddress, BindPort: j.cfg.BindPort},
			CertificateKey:   t.CertificateKey,
		}
	}
	if j.cfg.DiscoveryTimeout > 0 || j.cfg.TLSBootstrapTimeout > 0 {
		c.Timeouts = &kubeadm.Timeouts{
			Discovery:    duration(j.cfg.DiscoveryTimeout),
			TLSBootstrap: duration(j.cfg.TLSBootstrapTimeout),
		}
	}
	return c
}

func duration(d time.Duration) *metav1.Duration {
	if d <= 0 {
		return nil
	}
	return &metav1.Duration{Duration: d}
}

// Render returns the JoinConfiguration YAML for t, secrets included: it
// is what Join writes to its 0600 file. Never print it; use
// RenderRedacted for that.
func (j *Joiner) Render(t Ticket) ([]byte, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	out, err := yaml.Marshal(j.config(t))
	if err != nil {
		return nil, fmt.Errorf("join: render JoinConfiguration: %w", err)
	}
	return out, nil
}

// RenderRedacted is Render with the token secret and the certificate key
// replaced by Redacted: the --dry-run output an operator may read and
// paste. The token ID stays, so the token can still be named.
func (j *Joiner) RenderRedacted(t Ticket) ([]byte, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	t.Token = t.Token[:6] + "." + Redacted
	if t.ControlPlane {
		t.CertificateKey = Redacted
	}
	out, err := yaml.Marshal(j.config(t))
	if err != nil {
		return nil, fmt.Errorf("join: render JoinConfiguration: %w", err)
	}
	return out, nil
}
