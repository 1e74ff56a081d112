package join

import (
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	certutil "k8s.io/client-go/util/cert"
	kubeadm "k8s.io/kubernetes/cmd/kubeadm/app/apis/kubeadm/v1beta4"
	"k8s.io/kubernetes/cmd/kubeadm/app/util/pubkeypin"
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
	certs, err := certutil.ParseCertsPEM(bundle)
	if err != nil {
		return fmt.Errorf("join: ticket CA bundle: %w", err)
	}
	for _, c := range certs {
		if p := pubkeypin.Hash(c); !slices.Contains(pins, p) {
			return fmt.Errorf("join: ticket CA bundle holds %q (%s), which no CA cert hash pins", c.Subject.CommonName, p)
		}
	}
	return nil
}

// discoveryKubeconfig is kubeadm's file discovery input: the API server
// and the pinned CA bundle, no credentials (the token is the
// JoinConfiguration's tlsBootstrapToken).
func discoveryKubeconfig(t Ticket) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["latchkey"] = &clientcmdapi.Cluster{Server: "https://" + t.Endpoints[0], CertificateAuthorityData: t.CABundle}
	// An empty user: kubeadm wants a context with one, and takes the
	// credential from tlsBootstrapToken.
	cfg.AuthInfos["latchkey"] = &clientcmdapi.AuthInfo{}
	cfg.Contexts["latchkey"] = &clientcmdapi.Context{Cluster: "latchkey", AuthInfo: "latchkey"}
	cfg.CurrentContext = "latchkey"
	out, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, fmt.Errorf("join: render discovery kubeconfig: %w", err)
	}
	return out, nil
}

// discovery is file discovery when the ticket carries the CA bundle (no
// cluster-info signature needed: the bundle came over the attested,
// pinned session), and kubeadm's token discovery otherwise.
func discovery(t Ticket, discoveryFile string) kubeadm.Discovery {
	if len(t.CABundle) > 0 {
		return kubeadm.Discovery{File: &kubeadm.FileDiscovery{KubeConfigPath: discoveryFile}, TLSBootstrapToken: t.Token}
	}
	return kubeadm.Discovery{BootstrapToken: &kubeadm.BootstrapTokenDiscovery{
		Token: t.Token, APIServerEndpoint: t.Endpoints[0], CACertHashes: t.CACertHashes}}
}

// config builds the kubeadm JoinConfiguration for t; discoveryFile is
// where the discovery kubeconfig of file discovery is written.
func (j *Joiner) config(t Ticket, discoveryFile string) *kubeadm.JoinConfiguration {
	c := &kubeadm.JoinConfiguration{
		TypeMeta: metav1.TypeMeta{APIVersion: kubeadm.SchemeGroupVersion.String(), Kind: "JoinConfiguration"},
		NodeRegistration: kubeadm.NodeRegistrationOptions{
			Name:                  t.NodeName,
			CRISocket:             j.cfg.CRISocket,
			IgnorePreflightErrors: j.cfg.IgnorePreflightErrors,
		},
		Discovery: discovery(t, discoveryFile),
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
	out, err := yaml.Marshal(j.config(t, discoveryFile))
	if err != nil {
		return nil, fmt.Errorf("join: render JoinConfiguration: %w", err)
	}
	return out, nil
}
