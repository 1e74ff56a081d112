package app

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/latchkey/latchkey/verifier/binding"
)

// Etcd configures the etcd store of disk-only replicas
// (identity.etcd; docs/replicas.md): the binding records live in an
// etcd v3 cluster every replica shares, instead of one replica's
// bindingDir.
type Etcd struct {
	// Endpoints are the members' client URLs, https://host:port.
	Endpoints []string `json:"endpoints"`
	// CAFile is the CA that signs etcd's serving certificates; CertFile
	// and KeyFile are this verifier's client certificate and key (PEM).
	// All three are required unless Insecure.
	CAFile   string `json:"caFile,omitempty"`
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`
	// Prefix is prepended to every key, so several latchkey deployments
	// can share one etcd (default /latchkey/; it begins and ends with /).
	Prefix string `json:"prefix,omitempty"`
	// Insecure allows http:// endpoints without client certificates. Only
	// loopback endpoints (an IP literal or localhost) are accepted with
	// it: an etcd reached over a network must authenticate the verifier.
	Insecure bool `json:"insecure,omitempty"`
	// RequestTimeout bounds each etcd request (default 5s, 100ms to 60s).
	RequestTimeout Duration `json:"requestTimeout,omitempty"`
}

// Bounds of identity.etcd.
const (
	maxEtcdEndpoints = 16
	maxEtcdPrefix    = 128
	minEtcdTimeout   = 100 * time.Millisecond
	maxEtcdTimeout   = time.Minute
)

// validateEtcd checks identity.etcd (when set) and fills its defaults;
// every error names the key at fault.
func (c *Config) validateEtcd() error {
	e := c.Identity.Etcd
	if e == nil {
		return nil
	}
	switch {
	case c.Kubernetes != nil:
		return errors.New("identity.etcd: Kubernetes mode keeps the binding records in Leases; identity.etcd is for disk-only mode")
	case c.Identity.BindingDir != "":
		return errors.New("identity.etcd and identity.bindingDir are exclusive: the records live in one store")
	}
	if err := validateEtcdEndpoints(e.Endpoints, e.Insecure); err != nil {
		return err
	}
	if e.Insecure {
		if e.CAFile != "" || e.CertFile != "" || e.KeyFile != "" {
			return errors.New("identity.etcd.insecure: caFile, certFile and keyFile are not used without TLS; remove them or insecure")
		}
	} else {
		for _, f := range []struct{ key, val string }{{"caFile", e.CAFile}, {"certFile", e.CertFile}, {"keyFile", e.KeyFile}} {
			if f.val == "" {
				return fmt.Errorf("identity.etcd.%s: required (etcd must authenticate the verifier with a client certificate)", f.key)
			}
		}
	}
	if e.Prefix == "" {
		e.Prefix = binding.DefaultEtcdPrefix
	}
	if err := validateEtcdPrefix(e.Prefix); err != nil {
		return err
	}
	if e.RequestTimeout.Duration == 0 {
		e.RequestTimeout.Duration = binding.DefaultEtcdRequestTimeout
	}
	if d := e.RequestTimeout.Duration; d < minEtcdTimeout || d > maxEtcdTimeout {
		return fmt.Errorf("identity.etcd.requestTimeout %v: want %v to %v", d, minEtcdTimeout, maxEtcdTimeout)
	}
	return nil
}

func validateEtcdEndpoints(eps []string, insecure bool) error {
	if len(eps) == 0 {
		return errors.New("identity.etcd.endpoints: required (the members' client URLs)")
	}
	if len(eps) > maxEtcdEndpoints {
		return fmt.Errorf("identity.etcd.endpoints: %d endpoints, at most %d", len(eps), maxEtcdEndpoints)
	}
	seen := map[string]bool{}
	for i, ep := range eps {
		if err := validateEtcdEndpoint(ep, insecure); err != nil {
			return fmt.Errorf("identity.etcd.endpoints[%d] %.80q: %w", i, ep, err)
		}
		if seen[ep] {
			return fmt.Errorf("identity.etcd.endpoints[%d] %.80q: listed twice", i, ep)
		}
		seen[ep] = true
	}
	return nil
}

// validateEtcdEndpoint accepts scheme://host:port and nothing else: an
// https URL, or an http URL on a loopback address with insecure.
func validateEtcdEndpoint(ep string, insecure bool) error {
	u, err := url.Parse(ep)
	if err != nil {
		return errors.New("not a URL")
	}
	if u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return errors.New("want scheme://host:port only")
	}
	if u.Port() == "" || u.Hostname() == "" {
		return errors.New("want scheme://host:port (the port is required)")
	}
	switch u.Scheme {
	case "https":
		if insecure {
			return errors.New("insecure is set, so the endpoints must be http:// on loopback")
		}
		return nil
	case "http":
		if !insecure {
			return errors.New("plain http needs identity.etcd.insecure: true, which is allowed on loopback only; use https with client certificates")
		}
		if !isLoopbackHost(u.Hostname()) {
			return errors.New("identity.etcd.insecure is allowed on loopback endpoints only (127.0.0.0/8, ::1 or localhost)")
		}
		return nil
	}
	return fmt.Errorf("scheme %q: want https", u.Scheme)
}

// isLoopbackHost accepts a loopback IP literal or "localhost", never a
// name that merely begins like one (127.0.0.1.example.com).
func isLoopbackHost(h string) bool {
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func validateEtcdPrefix(p string) error {
	switch {
	case len(p) > maxEtcdPrefix:
		return fmt.Errorf("identity.etcd.prefix: %d bytes, at most %d", len(p), maxEtcdPrefix)
	case !strings.HasPrefix(p, "/") || !strings.HasSuffix(p, "/"):
		return fmt.Errorf("identity.etcd.prefix %.80q: want one that begins and ends with /", p)
	case strings.Contains(p, "//"):
		return fmt.Errorf("identity.etcd.prefix %.80q: empty path segment", p)
	}
	for _, r := range p {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-", r)) {
			return fmt.Errorf("identity.etcd.prefix %.80q: character %q (want letters, digits and / . _ -)", p, r)
		}
	}
	return nil
}

// newEtcdStore opens the etcd store of cfg. It does not wait for etcd
// (a join that finds it unreachable is refused UNAVAILABLE), but an
// unreadable certificate or key is the operator's to fix: ErrConfig, so
// the unit does not restart in a loop.
func newEtcdStore(cfg *Config, deps Deps, observe func(op string, d time.Duration, err error)) (*binding.Etcd, error) {
	e := cfg.Identity.Etcd
	s, err := binding.NewEtcd(binding.EtcdConfig{Endpoints: e.Endpoints, CAFile: e.CAFile, CertFile: e.CertFile, KeyFile: e.KeyFile,
		Insecure: e.Insecure, Prefix: e.Prefix, RequestTimeout: e.RequestTimeout.Duration, Logger: deps.Logger, Observe: observe})
	if err != nil {
		return nil, fmt.Errorf("%w: identity.etcd: %w", ErrConfig, err)
	}
	return s, nil
}

// OpenEtcdStore validates cfg and opens its etcd store, for the
// `store check` and `bindings migrate` commands.
func OpenEtcdStore(cfg *Config, deps Deps) (*binding.Etcd, error) {
	if cfg.Identity.Etcd == nil {
		return nil, errors.New("no identity.etcd in the configuration: the records are in identity.bindingDir (or Leases)")
	}
	if err := cfg.validateEtcd(); err != nil {
		return nil, err
	}
	return newEtcdStore(cfg, deps, nil)
}
