package join

import "time"

// The wire structs below are the parts of kubeadm's v1beta4
// JoinConfiguration and of client-go's v1 kubeconfig that the agent
// writes. They are the agent's own so that the boot path does not link
// (and initialise at every start) client-go, apimachinery and kubeadm's
// API packages for two small files. Each field carries upstream's JSON
// name and omitempty choice, because upstream renders through
// encoding/json with sigs.k8s.io/yaml and the agent through encoding/json
// with strictyaml.Marshal, which writes what sigs.k8s.io/yaml writes
// without linking its yaml v2: the same tags give the same bytes. The test-only oracles
// (oracle_test.go) render every kind of ticket with the upstream types too
// and require identical output, so a kubeadm upgrade that changes the
// wire format fails the tests, not a join.

// kubeadmAPIVersion is the JoinConfiguration's apiVersion.
const kubeadmAPIVersion = "kubeadm.k8s.io/v1beta4"

// joinConfiguration is kubeadm's v1beta4 JoinConfiguration.
type joinConfiguration struct {
	APIVersion       string            `json:"apiVersion,omitempty"`
	Kind             string            `json:"kind,omitempty"`
	NodeRegistration nodeRegistration  `json:"nodeRegistration,omitempty"`
	Discovery        joinDiscovery     `json:"discovery"`
	ControlPlane     *joinControlPlane `json:"controlPlane,omitempty"`
	Timeouts         *joinTimeouts     `json:"timeouts,omitempty"`
}

// nodeRegistration is kubeadm's NodeRegistrationOptions. Taints has no
// omitempty upstream (nil means "kubeadm's default taints"), so it
// renders as null; the agent never sets it.
type nodeRegistration struct {
	Name                  string   `json:"name,omitempty"`
	CRISocket             string   `json:"criSocket,omitempty"`
	Taints                []any    `json:"taints"`
	IgnorePreflightErrors []string `json:"ignorePreflightErrors,omitempty"`
}

// joinDiscovery is kubeadm's Discovery.
type joinDiscovery struct {
	BootstrapToken    *bootstrapTokenDiscovery `json:"bootstrapToken,omitempty"`
	File              *fileDiscovery           `json:"file,omitempty"`
	TLSBootstrapToken string                   `json:"tlsBootstrapToken,omitempty"`
}

// bootstrapTokenDiscovery is kubeadm's BootstrapTokenDiscovery.
type bootstrapTokenDiscovery struct {
	Token             string   `json:"token"`
	APIServerEndpoint string   `json:"apiServerEndpoint,omitempty"`
	CACertHashes      []string `json:"caCertHashes,omitempty"`
}

// fileDiscovery is kubeadm's FileDiscovery.
type fileDiscovery struct {
	KubeConfigPath string `json:"kubeConfigPath"`
}

// joinControlPlane is kubeadm's JoinControlPlane.
type joinControlPlane struct {
	LocalAPIEndpoint apiEndpoint `json:"localAPIEndpoint,omitempty"`
	CertificateKey   string      `json:"certificateKey,omitempty"`
}

// apiEndpoint is kubeadm's APIEndpoint.
type apiEndpoint struct {
	AdvertiseAddress string `json:"advertiseAddress,omitempty"`
	BindPort         int32  `json:"bindPort,omitempty"`
}

// joinTimeouts is the part of kubeadm's Timeouts a join sets.
type joinTimeouts struct {
	TLSBootstrap *duration `json:"tlsBootstrap,omitempty"`
	Discovery    *duration `json:"discovery,omitempty"`
}

// duration renders like apimachinery's metav1.Duration: the string of
// time.Duration.
type duration time.Duration

// MarshalJSON implements json.Marshaler.
func (d duration) MarshalJSON() ([]byte, error) {
	return []byte(`"` + time.Duration(d).String() + `"`), nil
}

// kubeconfig is client-go's v1 Config with the fields a discovery
// kubeconfig uses (upstream's preferences are omitzero: never written).
type kubeconfig struct {
	APIVersion     string          `json:"apiVersion,omitempty"`
	Kind           string          `json:"kind,omitempty"`
	Clusters       []namedCluster  `json:"clusters"`
	AuthInfos      []namedAuthInfo `json:"users"`
	Contexts       []namedContext  `json:"contexts"`
	CurrentContext string          `json:"current-context"`
}

type namedCluster struct {
	Name    string  `json:"name"`
	Cluster cluster `json:"cluster"`
}

// cluster is client-go's v1 Cluster; the []byte is base64 in JSON, as
// upstream's.
type cluster struct {
	Server                   string `json:"server"`
	CertificateAuthorityData []byte `json:"certificate-authority-data,omitempty"`
}

// namedAuthInfo names an empty user: kubeadm wants a context with one and
// takes the credential from the JoinConfiguration's tlsBootstrapToken.
type namedAuthInfo struct {
	Name     string   `json:"name"`
	AuthInfo struct{} `json:"user"`
}

type namedContext struct {
	Name    string      `json:"name"`
	Context kubeContext `json:"context"`
}

type kubeContext struct {
	Cluster  string `json:"cluster"`
	AuthInfo string `json:"user"`
}
