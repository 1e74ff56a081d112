package join

// The oracles: the upstream types the agent's wire structs (wire.go)
// stand in for. They are linked into this test only, never into the
// agent.

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	kubeadm "k8s.io/kubernetes/cmd/kubeadm/app/apis/kubeadm/v1beta4"
	"sigs.k8s.io/yaml"

	"github.com/latchkey/latchkey/internal/execx/execxtest"
)

// upstreamConfig builds t's JoinConfiguration with kubeadm's own v1beta4
// types, from the same inputs as Joiner.config.
func upstreamConfig(cfg Config, t Ticket, discoveryFile string) *kubeadm.JoinConfiguration {
	c := &kubeadm.JoinConfiguration{
		TypeMeta: metav1.TypeMeta{APIVersion: kubeadm.SchemeGroupVersion.String(), Kind: "JoinConfiguration"},
		NodeRegistration: kubeadm.NodeRegistrationOptions{
			Name: t.NodeName, CRISocket: cfg.CRISocket, IgnorePreflightErrors: cfg.IgnorePreflightErrors,
		},
	}
	if len(t.CABundle) > 0 {
		c.Discovery = kubeadm.Discovery{File: &kubeadm.FileDiscovery{KubeConfigPath: discoveryFile}, TLSBootstrapToken: t.Token}
	} else {
		c.Discovery = kubeadm.Discovery{BootstrapToken: &kubeadm.BootstrapTokenDiscovery{
			Token: t.Token, APIServerEndpoint: t.Endpoints[0], CACertHashes: t.CACertHashes}}
	}
	if t.ControlPlane {
		c.ControlPlane = &kubeadm.JoinControlPlane{
			LocalAPIEndpoint: kubeadm.APIEndpoint{AdvertiseAddress: cfg.AdvertiseAddress, BindPort: cfg.BindPort},
			CertificateKey:   t.CertificateKey,
		}
	}
	opt := func(d time.Duration) *metav1.Duration {
		if d <= 0 {
			return nil
		}
		return &metav1.Duration{Duration: d}
	}
	if cfg.DiscoveryTimeout > 0 || cfg.TLSBootstrapTimeout > 0 {
		c.Timeouts = &kubeadm.Timeouts{Discovery: opt(cfg.DiscoveryTimeout), TLSBootstrap: opt(cfg.TLSBootstrapTimeout)}
	}
	return c
}

// upstreamKubeconfig is the discovery kubeconfig as client-go writes it.
func upstreamKubeconfig(t *testing.T, tk Ticket) []byte {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["latchkey"] = &clientcmdapi.Cluster{Server: "https://" + tk.Endpoints[0], CertificateAuthorityData: tk.CABundle}
	cfg.AuthInfos["latchkey"] = &clientcmdapi.AuthInfo{}
	cfg.Contexts["latchkey"] = &clientcmdapi.Context{Cluster: "latchkey", AuthInfo: "latchkey"}
	cfg.CurrentContext = "latchkey"
	out, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// oracleCase is one configuration and ticket the oracles compare.
type oracleCase struct {
	name string
	cfg  func(*Config)
	tk   func(*testing.T) Ticket
}

func oracleCases() []oracleCase {
	controlPlane := func(*testing.T) Ticket {
		tk := workerTicket()
		tk.ControlPlane, tk.CertificateKey = true, key
		return tk
	}
	return []oracleCase{
		{"worker, defaults", nil, func(*testing.T) Ticket { return workerTicket() }},
		{"worker, one pin, one endpoint", nil, func(*testing.T) Ticket {
			tk := workerTicket()
			tk.Endpoints, tk.CACertHashes = tk.Endpoints[:1], tk.CACertHashes[:1]
			return tk
		}},
		{"worker, many pins and endpoints", nil, func(*testing.T) Ticket {
			tk := workerTicket()
			tk.Endpoints = append(tk.Endpoints, "[2001:db8::1]:6443", "api.example.com:443")
			tk.CACertHashes = append(tk.CACertHashes, "sha256:"+strings.Repeat("0f", 32))
			return tk
		}},
		{"worker, every option", func(c *Config) {
			c.DiscoveryTimeout, c.TLSBootstrapTimeout = 90*time.Second, 4*time.Minute+500*time.Millisecond
			c.CRISocket = "unix:///run/containerd/containerd.sock"
			c.IgnorePreflightErrors = []string{"Swap", "NumCPU", "all"}
		}, func(*testing.T) Ticket { return workerTicket() }},
		{"worker, only the TLS bootstrap timeout", func(c *Config) { c.TLSBootstrapTimeout = time.Minute }, func(*testing.T) Ticket { return workerTicket() }},
		{"worker, dry run", func(c *Config) { c.DryRun, c.IgnorePreflightErrors = true, []string{"all"} }, func(*testing.T) Ticket { return workerTicket() }},
		{"control plane, defaults", nil, controlPlane},
		{"control plane, endpoint and socket", func(c *Config) {
			c.AdvertiseAddress, c.BindPort = "192.0.2.20", 6443
			c.CRISocket = "unix:///var/run/crio/crio.sock"
			c.DiscoveryTimeout = 5 * time.Minute
		}, controlPlane},
		{"control plane, IPv6 advertise address", func(c *Config) { c.AdvertiseAddress = "2001:db8::20" }, controlPlane},
		{"worker, file discovery", nil, fileTicket},
		{"control plane, file discovery with two CAs", func(c *Config) { c.TLSBootstrapTimeout = 2 * time.Minute }, func(t *testing.T) Ticket {
			tk := fileTicket(t)
			ca, p := testCA(t, "second")
			tk.CABundle, tk.CACertHashes = append(tk.CABundle, ca...), append(tk.CACertHashes, p)
			tk.ControlPlane, tk.CertificateKey = true, key
			return tk
		}},
	}
}

// The agent's JoinConfiguration is byte for byte what kubeadm's own
// v1beta4 types render for the same ticket, redacted or not.
func TestRenderMatchesKubeadmTypes(t *testing.T) {
	for _, c := range oracleCases() {
		t.Run(c.name, func(t *testing.T) {
			j := newJoiner(t, &execxtest.Fake{}, c.cfg)
			tk := c.tk(t)
			for _, redact := range []bool{false, true} {
				discoveryFile := j.discoveryPath(j.cfg.Dir + "/kubeadm-join.yaml")
				got, err := j.render(tk, discoveryFile, redact)
				if err != nil {
					t.Fatal(err)
				}
				up := tk
				if redact {
					up.Token = tk.Token[:6] + "." + Redacted
					if up.ControlPlane {
						up.CertificateKey = Redacted
					}
				}
				want, err := yaml.Marshal(upstreamConfig(j.cfg, up, discoveryFile))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("redact=%v: agent rendered\n%s\nkubeadm's types render\n%s", redact, got, want)
				}
			}
		})
	}
}

// The discovery kubeconfig is byte for byte what client-go writes.
func TestDiscoveryKubeconfigMatchesClientGo(t *testing.T) {
	for _, c := range oracleCases() {
		tk := c.tk(t)
		if len(tk.CABundle) == 0 {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			got, err := discoveryKubeconfig(tk)
			if err != nil {
				t.Fatal(err)
			}
			if want := upstreamKubeconfig(t, tk); !bytes.Equal(got, want) {
				t.Fatalf("agent wrote\n%s\nclient-go writes\n%s", got, want)
			}
			// And client-go reads it back as the same cluster.
			kc, err := clientcmd.Load(got)
			if err != nil {
				t.Fatal(err)
			}
			cl := kc.Clusters[kc.Contexts[kc.CurrentContext].Cluster]
			if cl.Server != "https://"+tk.Endpoints[0] || !bytes.Equal(cl.CertificateAuthorityData, tk.CABundle) {
				t.Fatalf("client-go reads server %q, bundle equal %v", cl.Server, bytes.Equal(cl.CertificateAuthorityData, tk.CABundle))
			}
		})
	}
}

// Each upstream kubeadm field the agent sets round-trips: decoding the
// agent's bytes with kubeadm's types and rendering again gives the same
// bytes, so no field is dropped by a name kubeadm does not know.
func TestRenderDecodesIntoKubeadmTypes(t *testing.T) {
	for _, c := range oracleCases() {
		t.Run(c.name, func(t *testing.T) {
			j := newJoiner(t, &execxtest.Fake{}, c.cfg)
			got, err := j.Render(c.tk(t))
			if err != nil {
				t.Fatal(err)
			}
			var up kubeadm.JoinConfiguration
			if err := yaml.UnmarshalStrict(got, &up); err != nil {
				t.Fatalf("kubeadm's types refuse the agent's config: %v", err)
			}
			again, err := yaml.Marshal(&up)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, again) {
				t.Fatal(fmt.Sprintf("round trip changed the config:\n%s\n---\n%s", got, again))
			}
		})
	}
}
