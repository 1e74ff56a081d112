// Package cordon marks the agent's own Node unschedulable after an
// offline unlock (docs/offline-unlock.md), with the kubelet's credentials.
//
// While no verifier runs, nothing else marks a node that unlocked
// without one: the verifier's latchkey.io/unattested taint needs the
// verifier. The kubelet's credentials cannot taint the Node (the
// NodeRestriction admission plugin refuses taint changes by nodes) but
// may set spec.unschedulable and annotations, so the agent cordons the
// Node and says so in the latchkey.io/cordoned annotation; the verifier
// lifts only a cordon that carries it, once the node's re-attestation
// after the offline boot is accepted. A node an operator had cordoned is
// left alone: its cordon is never claimed as latchkey's.
//
// The client is a small HTTPS client of two requests (GET and a JSON
// merge patch of the Node) rather than client-go, which the agent does
// not link (agent/join/wire.go says why). Every response is
// size-limited and validated; the patch carries the Node's
// resourceVersion, so a change made meanwhile (an operator's cordon) is
// re-read, not overwritten.
package cordon

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/latchkey/latchkey/internal/kubekey"
	"github.com/latchkey/latchkey/internal/logkey"
	"github.com/latchkey/latchkey/internal/strictyaml"
)

// DefaultKubeconfig is the kubelet's kubeconfig kubeadm writes (on the
// state disk, bind-mounted at /etc/kubernetes once the disk is open).
const DefaultKubeconfig = "/etc/kubernetes/kubelet.conf"

// Limits.
const (
	// MaxResponse bounds a Node object or a Status read from the API
	// server (a Node with a long image list is some hundred KiB).
	MaxResponse = 4 << 20
	// MaxKubeconfig bounds the kubeconfig and each file it names.
	MaxKubeconfig = 1 << 20
	// DefaultTimeout bounds one attempt (its requests, retries included).
	DefaultTimeout = 10 * time.Second
	// conflictRetries is how often one attempt re-reads the Node after a
	// conflict.
	conflictRetries = 3
)

// ValueOffline is AnnotationCordoned's value.
const ValueOffline = "offline"

// FieldManager names the agent's changes in the Node's managedFields.
const FieldManager = "latchkey-agent"

// Result of one attempt.
type Result string

// Results.
const (
	// Cordoned: this attempt set spec.unschedulable and the annotation.
	Cordoned Result = "cordoned"
	// Renewed: the Node already carried latchkey's cordon (an earlier
	// offline boot that no verifier has attested since); this attempt
	// moved its time to now, so only a re-attestation after this boot
	// lifts it.
	Renewed Result = "cordon renewed"
	// OperatorCordon: the Node was unschedulable without latchkey's
	// annotation; it is left as it is.
	OperatorCordon Result = "already unschedulable (not latchkey's cordon): left alone"
)

// Errors.
var (
	// ErrConflict: the Node kept changing between the read and the patch.
	ErrConflict = errors.New("cordon: the node changed during every attempt (conflict)")
	// ErrBadResponse: the API server's answer was not a valid Node.
	ErrBadResponse = errors.New("cordon: invalid response from the API server")
)

// Config configures a Cordoner.
type Config struct {
	// NodeName is the Node to cordon: the agent's own.
	NodeName string
	// Kubeconfig is the kubelet's kubeconfig (DefaultKubeconfig); it is
	// read at each attempt, so a rotated client certificate is used.
	Kubeconfig string
	// Timeout bounds one attempt (DefaultTimeout).
	Timeout time.Duration
	Logger  *slog.Logger
	// Now is the clock used when the API server sends no Date.
	Now func() time.Time
}

// Cordoner cordons the agent's Node.
type Cordoner struct {
	cfg Config
	// cordoned: an attempt cordoned the Node (or renewed the cordon).
	cordoned atomic.Bool
}

// New checks cfg and fills defaults.
func New(cfg Config) (*Cordoner, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("cordon: node name required")
	}
	if cfg.Kubeconfig == "" {
		cfg.Kubeconfig = DefaultKubeconfig
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Cordoner{cfg: cfg}, nil
}

// Cordon makes one bounded attempt and logs its outcome; done is true when
// nothing is left to do (cordoned now or before, or an operator's cordon
// found). It never blocks longer than the attempt's timeout.
func (c *Cordoner) Cordon(ctx context.Context) (done bool) {
	r, err := c.Attempt(ctx)
	if err != nil {
		c.cfg.Logger.Warn("node not cordoned after the offline unlock; retried before the next re-attestation",
			logkey.Node, c.cfg.NodeName, logkey.Error, err.Error())
		return false
	}
	if r == Cordoned || r == Renewed {
		c.cordoned.Store(true)
		c.cfg.Logger.Warn("node cordoned while offline: unschedulable until a verifier attests it", logkey.Node, c.cfg.NodeName, logkey.Result, string(r))
	} else {
		c.cfg.Logger.Info("node not cordoned after the offline unlock", logkey.Node, c.cfg.NodeName, logkey.Result, string(r))
	}
	return true
}

// Cordoned reports whether an attempt of Cordon cordoned the Node (the
// status line says so).
func (c *Cordoner) Cordoned() bool { return c.cordoned.Load() }

// Attempt reads the Node and cordons it if it is schedulable, or renews
// latchkey's own cordon; a conflict re-reads it (a bounded number of
// times).
func (c *Cordoner) Attempt(ctx context.Context) (Result, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	api, err := loadKubeconfig(c.cfg.Kubeconfig)
	if err != nil {
		return "", err
	}
	defer api.tr.CloseIdleConnections()
	for range conflictRetries {
		n, date, err := api.getNode(ctx, c.cfg.NodeName)
		if err != nil {
			return "", err
		}
		ours := n.Metadata.Annotations[kubekey.AnnotationCordoned] == ValueOffline
		if n.Spec.Unschedulable && !ours {
			return OperatorCordon, nil
		}
		if date.IsZero() {
			date = c.cfg.Now()
		}
		err = api.patchNode(ctx, c.cfg.NodeName, cordonPatch(n.Metadata.ResourceVersion, date))
		if errors.Is(err, errConflict) {
			continue
		}
		if err != nil {
			return "", err
		}
		if n.Spec.Unschedulable {
			return Renewed, nil
		}
		return Cordoned, nil
	}
	return "", ErrConflict
}

// cordonPatch is the merge patch that cordons a Node read at rv.
func cordonPatch(rv string, at time.Time) []byte {
	p, _ := json.Marshal(map[string]any{ // maps of strings and bools always marshal
		"metadata": map[string]any{
			"resourceVersion": rv,
			"annotations": map[string]string{
				kubekey.AnnotationCordoned:   ValueOffline,
				kubekey.AnnotationCordonedAt: at.UTC().Format(time.RFC3339),
			},
		},
		"spec": map[string]any{"unschedulable": true},
	})
	return p
}

// node is the part of a v1 Node the agent reads.
type node struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name            string            `json:"name"`
		ResourceVersion string            `json:"resourceVersion"`
		Annotations     map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		Unschedulable bool `json:"unschedulable"`
	} `json:"spec"`
}

// status is the part of a v1 Status (an API error) the agent reports.
type status struct {
	Kind    string `json:"kind"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// errConflict is a 409 to the patch.
var errConflict = errors.New("conflict")

// apiClient talks to one API server as the kubelet.
type apiClient struct {
	server *url.URL
	http   *http.Client
	tr     *http.Transport
}

func (a *apiClient) nodeURL(name string) string {
	u := *a.server
	u.Path = strings.TrimSuffix(u.Path, "/") + "/api/v1/nodes/" + url.PathEscape(name)
	return u.String()
}

// getNode reads the Node and the API server's Date.
func (a *apiClient) getNode(ctx context.Context, name string) (*node, time.Time, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.nodeURL(name), nil)
	if err != nil {
		return nil, time.Time{}, err
	}
	req.Header.Set("Accept", "application/json")
	n, hdr, err := a.do(req, name)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("cordon: get node %s: %w", name, err)
	}
	date, _ := http.ParseTime(hdr.Get("Date")) // absent or malformed: the caller's clock
	return n, date, nil
}

// patchNode applies a merge patch; errConflict on a 409.
func (a *apiClient) patchNode(ctx context.Context, name string, patch []byte) error {
	u := a.nodeURL(name) + "?fieldManager=" + FieldManager
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, u, bytes.NewReader(patch))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/merge-patch+json")
	req.Header.Set("Accept", "application/json")
	n, _, err := a.do(req, name)
	if err != nil {
		if errors.Is(err, errConflict) {
			return err
		}
		return fmt.Errorf("cordon: patch node %s: %w", name, err)
	}
	if !n.Spec.Unschedulable || n.Metadata.Annotations[kubekey.AnnotationCordoned] != ValueOffline {
		return fmt.Errorf("cordon: patch node %s: %w: the patched node is not cordoned", name, ErrBadResponse)
	}
	return nil
}

// do sends req and decodes a Node named name from a 200, or the API's
// Status from an error.
func (a *apiClient) do(req *http.Request, name string) (*node, http.Header, error) {
	resp, err := a.http.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponse+1))
	if err != nil {
		return nil, nil, err
	}
	if len(body) > MaxResponse {
		return nil, nil, fmt.Errorf("%w: over %d bytes", ErrBadResponse, MaxResponse)
	}
	if resp.StatusCode == http.StatusConflict && req.Method == http.MethodPatch {
		return nil, nil, errConflict
	}
	if resp.StatusCode != http.StatusOK {
		return nil, nil, apiError(resp.StatusCode, body)
	}
	var n node
	if err := json.Unmarshal(body, &n); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrBadResponse, err)
	}
	if n.Kind != "Node" || n.Metadata.Name != name || n.Metadata.ResourceVersion == "" {
		return nil, nil, fmt.Errorf("%w: not the node %q with a resourceVersion (kind %q, name %q)", ErrBadResponse, name, n.Kind, n.Metadata.Name)
	}
	return &n, resp.Header, nil
}

// apiError names an API server's refusal: its Status reason and message
// when the body is one, else the HTTP status alone (a body that is not a
// Status is not repeated into the log).
func apiError(code int, body []byte) error {
	var s status
	if json.Unmarshal(body, &s) == nil && s.Kind == "Status" && s.Message != "" {
		return fmt.Errorf("HTTP %d %s: %s", code, s.Reason, truncate(s.Message, 512))
	}
	return fmt.Errorf("HTTP %d", code)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// kubeconfig is the part of a v1 kubeconfig the kubelet's uses.
type kubeconfig struct {
	CurrentContext string `json:"current-context"`
	Clusters       []struct {
		Name    string `json:"name"`
		Cluster struct {
			Server                   string `json:"server"`
			CertificateAuthority     string `json:"certificate-authority"`
			CertificateAuthorityData string `json:"certificate-authority-data"`
			TLSServerName            string `json:"tls-server-name"`
		} `json:"cluster"`
	} `json:"clusters"`
	Contexts []struct {
		Name    string `json:"name"`
		Context struct {
			Cluster string `json:"cluster"`
			User    string `json:"user"`
		} `json:"context"`
	} `json:"contexts"`
	Users []struct {
		Name string `json:"name"`
		User struct {
			ClientCertificate     string `json:"client-certificate"`
			ClientCertificateData string `json:"client-certificate-data"`
			ClientKey             string `json:"client-key"`
			ClientKeyData         string `json:"client-key-data"`
		} `json:"user"`
	} `json:"users"`
}

// loadKubeconfig reads the kubelet's kubeconfig: its current context's
// server, CA and client certificate. Anything it cannot resolve is an
// error; the client never falls back to an unverified server.
func loadKubeconfig(path string) (*apiClient, error) {
	raw, err := readLimited(path)
	if err != nil {
		return nil, fmt.Errorf("cordon: kubeconfig: %w", err)
	}
	var kc kubeconfig
	if err := strictyaml.UnmarshalForeign(raw, &kc); err != nil {
		return nil, fmt.Errorf("cordon: kubeconfig %s: %w", path, err)
	}
	var clusterName, userName string
	for _, c := range kc.Contexts {
		if c.Name == kc.CurrentContext {
			clusterName, userName = c.Context.Cluster, c.Context.User
		}
	}
	if kc.CurrentContext == "" || clusterName == "" || userName == "" {
		return nil, fmt.Errorf("cordon: kubeconfig %s: current context %q not found", path, kc.CurrentContext)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	var server *url.URL
	for _, c := range kc.Clusters {
		if c.Name != clusterName {
			continue
		}
		if server, err = url.Parse(c.Cluster.Server); err != nil || server.Scheme != "https" || server.Host == "" {
			return nil, fmt.Errorf("cordon: kubeconfig %s: server %q is not an https URL", path, c.Cluster.Server)
		}
		ca, err := dataOrFile(c.Cluster.CertificateAuthorityData, rel(path, c.Cluster.CertificateAuthority))
		if err != nil {
			return nil, fmt.Errorf("cordon: kubeconfig %s: certificate authority: %w", path, err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(ca) {
			return nil, fmt.Errorf("cordon: kubeconfig %s: no CA certificate", path)
		}
		tc.ServerName = c.Cluster.TLSServerName
	}
	if server == nil {
		return nil, fmt.Errorf("cordon: kubeconfig %s: cluster %q not found", path, clusterName)
	}
	found := false
	for _, u := range kc.Users {
		if u.Name != userName {
			continue
		}
		cert, err1 := dataOrFile(u.User.ClientCertificateData, rel(path, u.User.ClientCertificate))
		key, err2 := dataOrFile(u.User.ClientKeyData, rel(path, u.User.ClientKey))
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("cordon: kubeconfig %s: client credentials: %w", path, err)
		}
		pair, err := tls.X509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("cordon: kubeconfig %s: client credentials: %w", path, err)
		}
		tc.Certificates, found = []tls.Certificate{pair}, true
	}
	if !found {
		return nil, fmt.Errorf("cordon: kubeconfig %s: user %q not found", path, userName)
	}
	tr := &http.Transport{TLSClientConfig: tc, Proxy: nil, ForceAttemptHTTP2: true}
	return &apiClient{server: server, tr: tr, http: &http.Client{Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}, nil
}

// rel resolves a file a kubeconfig names relative to the kubeconfig's
// directory, as client-go does.
func rel(kubeconfig, file string) string {
	if file == "" || filepath.IsAbs(file) {
		return file
	}
	return filepath.Join(filepath.Dir(kubeconfig), file)
}

// dataOrFile is base64 data if set, else the named file's content.
func dataOrFile(data, file string) ([]byte, error) {
	switch {
	case data != "":
		return base64.StdEncoding.DecodeString(data)
	case file != "":
		return readLimited(file)
	}
	return nil, errors.New("neither data nor a file")
}

// readLimited reads a file of at most MaxKubeconfig bytes.
func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxKubeconfig+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxKubeconfig {
		return nil, fmt.Errorf("%s: over %d bytes", path, MaxKubeconfig)
	}
	return b, nil
}
