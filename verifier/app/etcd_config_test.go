package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const etcdTLS = "  etcd:\n    endpoints: [https://10.0.0.1:2379, https://10.0.0.2:2379]\n    caFile: /etc/latchkey/etcd-ca.crt\n    certFile: /etc/latchkey/etcd.crt\n    keyFile: /etc/latchkey/etcd.key\n"

// loadEtcdConfig loads and validates a disk-only config whose identity
// section is identity.
func loadEtcdConfig(t *testing.T, identity string) (*Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "verifier.yaml")
	yaml := "policy: /etc/latchkey/policy.yaml\nclusterSalt: salt\nidentity:\n" + identity
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(path)
	if err != nil {
		return nil, err
	}
	return c, c.Validate()
}

// identity.etcd is strict, secure by default, and every error names the
// key at fault.
func TestEtcdConfig(t *testing.T) {
	c, err := loadEtcdConfig(t, etcdTLS)
	if err != nil {
		t.Fatal(err)
	}
	if e := c.Identity.Etcd; e.Prefix != "/latchkey/" || e.RequestTimeout.Duration != 5*time.Second || e.Insecure {
		t.Fatalf("defaults %+v", e)
	}
	for _, ok := range []string{
		"  etcd:\n    insecure: true\n    endpoints: [http://127.0.0.1:2379]\n",
		"  etcd:\n    insecure: true\n    endpoints: [\"http://[::1]:2379\", http://localhost:2379, http://127.8.9.1:2379]\n",
		etcdTLS + "    prefix: /site-a/latchkey/\n    requestTimeout: 2s\n",
	} {
		if _, err := loadEtcdConfig(t, ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, tc := range []struct{ yaml, want string }{
		{"  etcd:\n    endpoints: [https://10.0.0.1:2379]\n", "identity.etcd.caFile: required"},
		{strings.Replace(etcdTLS, "    keyFile: /etc/latchkey/etcd.key\n", "", 1), "identity.etcd.keyFile: required"},
		{strings.Replace(etcdTLS, "    certFile: /etc/latchkey/etcd.crt\n", "", 1), "identity.etcd.certFile: required"},
		{"  etcd:\n    caFile: x\n", "identity.etcd.endpoints: required"},
		// Plain HTTP needs insecure, and insecure needs loopback: names
		// that only begin like a loopback address are not one.
		{"  etcd:\n    endpoints: [http://127.0.0.1:2379]\n", "identity.etcd.endpoints[0] \"http://127.0.0.1:2379\": plain http needs identity.etcd.insecure"},
		{"  etcd:\n    insecure: true\n    endpoints: [http://127.0.0.1.example.com:2379]\n", "identity.etcd.endpoints[0] \"http://127.0.0.1.example.com:2379\": identity.etcd.insecure is allowed on loopback endpoints only"},
		{"  etcd:\n    insecure: true\n    endpoints: [http://localhost.example.com:2379]\n", "endpoints[0] \"http://localhost.example.com:2379\": identity.etcd.insecure is allowed on loopback"},
		{"  etcd:\n    insecure: true\n    endpoints: [http://10.0.0.1:2379]\n", "identity.etcd.insecure is allowed on loopback endpoints only"},
		{"  etcd:\n    insecure: true\n    endpoints: [http://127.0.0.1:2379, http://10.1.1.1:2379]\n", "identity.etcd.endpoints[1]"},
		{"  etcd:\n    insecure: true\n    endpoints: [https://127.0.0.1:2379]\n", "insecure is set, so the endpoints must be http:// on loopback"},
		{"  etcd:\n    insecure: true\n    endpoints: [http://127.0.0.1:2379]\n    caFile: /x\n", "identity.etcd.insecure: caFile, certFile and keyFile are not used"},
		{strings.Replace(etcdTLS, "https://10.0.0.2:2379", "unix:///run/etcd.sock", 1), "identity.etcd.endpoints[1] \"unix:///run/etcd.sock\""},
		{strings.Replace(etcdTLS, "https://10.0.0.2:2379", "https://10.0.0.2", 1), "endpoints[1] \"https://10.0.0.2\": want scheme://host:port (the port is required)"},
		{strings.Replace(etcdTLS, "https://10.0.0.2:2379", "https://user@10.0.0.2:2379", 1), "endpoints[1] \"https://user@10.0.0.2:2379\": want scheme://host:port only"},
		{strings.Replace(etcdTLS, "https://10.0.0.2:2379", "https://10.0.0.2:2379/v3", 1), "want scheme://host:port only"},
		{strings.Replace(etcdTLS, "https://10.0.0.2:2379", "https://10.0.0.1:2379", 1), "identity.etcd.endpoints[1] \"https://10.0.0.1:2379\": listed twice"},
		{etcdTLS + "    prefix: latchkey/\n", "identity.etcd.prefix \"latchkey/\": want one that begins and ends with /"},
		{etcdTLS + "    prefix: /latchkey\n", "want one that begins and ends with /"},
		{etcdTLS + "    prefix: /a//b/\n", "identity.etcd.prefix \"/a//b/\": empty path segment"},
		{etcdTLS + "    prefix: /a b/\n", "identity.etcd.prefix \"/a b/\": character ' '"},
		{etcdTLS + "    requestTimeout: 10ms\n", "identity.etcd.requestTimeout 10ms: want 100ms to 1m0s"},
		{etcdTLS + "  bindingDir: /var/lib/x\n", "identity.etcd and identity.bindingDir are exclusive"},
		// Strict keys.
		{etcdTLS + "    Prefix: /x/\n", `unknown field "identity.etcd.Prefix"`},
		{etcdTLS + "    endpoint: https://10.0.0.3:2379\n", `unknown field "identity.etcd.endpoint"`},
		{etcdTLS + "    caFile: /other\n", `key "identity.etcd.caFile" already set in map`},
	} {
		if _, err := loadEtcdConfig(t, tc.yaml); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.yaml, err, tc.want)
		}
	}
}

// Kubernetes mode keeps its records in Leases.
func TestEtcdConfigNotInKubernetesMode(t *testing.T) {
	c, err := loadEtcdConfig(t, etcdTLS)
	if err != nil {
		t.Fatal(err)
	}
	c.Kubernetes = &Kubernetes{}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "identity.etcd: Kubernetes mode keeps the binding records in Leases") {
		t.Fatalf("etcd in Kubernetes mode: %v", err)
	}
}
