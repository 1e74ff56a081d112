package cordon

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/latchkey/latchkey/internal/kubekey"
	"github.com/latchkey/latchkey/internal/pkitest"
)

// fakeAPI is an API server's Node endpoint: GET, and a merge patch
// refused with 409 when its resourceVersion is not the Node's.
type fakeAPI struct {
	mu            sync.Mutex
	rv            int
	unschedulable bool
	annotations   map[string]string
	// before runs before each request is served (a concurrent change).
	before func(f *fakeAPI, r *http.Request)
	// respond replaces the answer to requests whose method it names.
	respond map[string]func(w http.ResponseWriter)
	patches []map[string]any
	methods []string
	// clientCN is the client certificate's common name of each request.
	clientCN []string
	// date is the Date sent (testDate when zero).
	date time.Time
}

const testNode = "worker-1"

// testDate is the Date the fake sends: the cordon's time.
var testDate = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func (f *fakeAPI) nodeJSON() []byte {
	b, _ := json.Marshal(map[string]any{"kind": "Node", "apiVersion": "v1",
		"metadata": map[string]any{"name": testNode, "resourceVersion": strconv.Itoa(f.rv), "annotations": f.annotations},
		"spec":     map[string]any{"unschedulable": f.unschedulable},
		"status":   map[string]any{"images": []any{}}})
	return b
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.methods = append(f.methods, r.Method)
	if len(r.TLS.PeerCertificates) > 0 {
		f.clientCN = append(f.clientCN, r.TLS.PeerCertificates[0].Subject.CommonName)
	}
	if f.before != nil {
		f.before(f, r)
	}
	date := f.date
	if date.IsZero() {
		date = testDate
	}
	w.Header().Set("Date", date.Format(http.TimeFormat))
	if h := f.respond[r.Method]; h != nil {
		h(w)
		return
	}
	if r.URL.Path != "/api/v1/nodes/"+testNode {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	switch r.Method {
	case http.MethodGet:
		_, _ = w.Write(f.nodeJSON())
	case http.MethodPatch:
		if r.Header.Get("Content-Type") != "application/merge-patch+json" || r.URL.Query().Get("fieldManager") != FieldManager {
			http.Error(w, "bad patch", http.StatusUnsupportedMediaType)
			return
		}
		var p struct {
			Metadata struct {
				ResourceVersion string            `json:"resourceVersion"`
				Annotations     map[string]string `json:"annotations"`
			} `json:"metadata"`
			Spec struct {
				Unschedulable bool `json:"unschedulable"`
			} `json:"spec"`
		}
		body, _ := io.ReadAll(r.Body)
		var raw map[string]any
		_ = json.Unmarshal(body, &raw)
		f.patches = append(f.patches, raw)
		if err := json.Unmarshal(body, &p); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if p.Metadata.ResourceVersion != strconv.Itoa(f.rv) {
			writeStatus(w, http.StatusConflict, "Conflict", "the object has been modified; please apply your changes to the latest version and try again")
			return
		}
		f.rv++
		f.unschedulable = p.Spec.Unschedulable
		if f.annotations == nil {
			f.annotations = map[string]string{}
		}
		for k, v := range p.Metadata.Annotations {
			f.annotations[k] = v
		}
		_, _ = w.Write(f.nodeJSON())
	}
}

func writeStatus(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure",
		"reason": reason, "message": msg, "code": code})
}

// serve starts f behind TLS that requires a client certificate of ca,
// and writes a kubelet kubeconfig for it (the kubelet's certificate and
// key in one file, as kubelet-client-current.pem).
func serve(t *testing.T, f *fakeAPI) (kubeconfig string) {
	t.Helper()
	ca := pkitest.NewCA(t, "kubernetes")
	srv := httptest.NewUnstartedServer(f)
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	client := pkitest.Issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "system:node:" + testNode, Organization: []string{"system:nodes"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, ca)
	return WriteKubeletConfig(t, t.TempDir(), srv.URL, srv.Certificate().Raw, client)
}

// WriteKubeletConfig writes a kubeconfig as kubeadm writes the kubelet's:
// the CA inline, the client certificate and key in one PEM file named by
// path. serverCA is the DER of the server's CA (or self-signed server
// certificate).
func WriteKubeletConfig(t testing.TB, dir, server string, serverCA []byte, client *pkitest.Cert) string {
	t.Helper()
	caPEM := (&pkitest.Cert{Cert: &x509.Certificate{Raw: serverCA}}).PEM()
	pemPath := filepath.Join(dir, "kubelet-client-current.pem")
	if err := os.WriteFile(pemPath, append(client.PEM(), client.KeyPEM(t)...), 0o600); err != nil {
		t.Fatal(err)
	}
	kc := fmt.Sprintf(`apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: %s
    server: %s
  name: default-cluster
contexts:
- context:
    cluster: default-cluster
    namespace: default
    user: default-auth
  name: default-context
current-context: default-context
kind: Config
preferences: {}
users:
- name: default-auth
  user:
    client-certificate: %s
    client-key: %s
`, base64.StdEncoding.EncodeToString(caPEM), server, pemPath, pemPath)
	path := filepath.Join(dir, "kubelet.conf")
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func newCordoner(t *testing.T, kubeconfig string) *Cordoner {
	t.Helper()
	c, err := New(Config{NodeName: testNode, Kubeconfig: kubeconfig, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A schedulable Node is cordoned with one merge patch that carries the
// resourceVersion read, the annotation and the API server's time.
func TestCordonsASchedulableNode(t *testing.T) {
	f := &fakeAPI{rv: 7, annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0"}}
	c := newCordoner(t, serve(t, f))
	if !c.Cordon(context.Background()) || !c.Cordoned() {
		t.Fatalf("done %v", c.Cordoned())
	}
	if fmt.Sprint(f.methods) != "[GET PATCH]" || !f.unschedulable {
		t.Fatalf("requests %v, unschedulable %v", f.methods, f.unschedulable)
	}
	if f.clientCN[0] != "system:node:"+testNode {
		t.Fatalf("client %q, want the kubelet's certificate", f.clientCN[0])
	}
	want := map[string]string{"node.alpha.kubernetes.io/ttl": "0", kubekey.AnnotationCordoned: "offline", kubekey.AnnotationCordonedAt: "2026-03-01T12:00:00Z"}
	if fmt.Sprint(f.annotations) != fmt.Sprint(want) {
		t.Fatalf("annotations %v, want %v", f.annotations, want)
	}
	if rv := f.patches[0]["metadata"].(map[string]any)["resourceVersion"]; rv != "7" {
		t.Fatalf("patch resourceVersion %v, want 7", rv)
	}
	// A later offline boot finds latchkey's own cordon and renews its
	// time (here the API server's clock moved on).
	f.mu.Lock()
	f.date = testDate.Add(time.Hour)
	f.mu.Unlock()
	if r, err := c.Attempt(context.Background()); r != Renewed || err != nil || len(f.patches) != 2 ||
		f.annotations[kubekey.AnnotationCordonedAt] != "2026-03-01T13:00:00Z" || !f.unschedulable {
		t.Fatalf("second attempt: %q %v, %d patches, annotations %v", r, err, len(f.patches), f.annotations)
	}
}

// An operator's cordon is never claimed: no patch, and done.
func TestLeavesAnOperatorsCordonAlone(t *testing.T) {
	f := &fakeAPI{rv: 3, unschedulable: true}
	c := newCordoner(t, serve(t, f))
	r, err := c.Attempt(context.Background())
	if r != OperatorCordon || err != nil || len(f.patches) != 0 || f.annotations != nil {
		t.Fatalf("%q %v, patches %v, annotations %v", r, err, f.patches, f.annotations)
	}
	// Done, but the status does not say the agent cordoned the node.
	if !c.Cordon(context.Background()) || c.Cordoned() {
		t.Fatalf("operator's cordon: cordoned %v", c.Cordoned())
	}
	// The slip: an annotation that is not latchkey's value does not make
	// the cordon latchkey's.
	f.annotations = map[string]string{kubekey.AnnotationCordoned: "maintenance"}
	if r, err := c.Attempt(context.Background()); r != OperatorCordon || err != nil || len(f.patches) != 0 {
		t.Fatalf("%q %v, patches %v", r, err, f.patches)
	}
}

// A conflict re-reads the Node: an operator who cordoned it meanwhile
// keeps the cordon as theirs; a change to something else is patched over
// at the new resourceVersion.
func TestConflictRereads(t *testing.T) {
	t.Run("operator cordoned meanwhile", func(t *testing.T) {
		f := &fakeAPI{rv: 1}
		f.before = func(f *fakeAPI, r *http.Request) {
			if r.Method == http.MethodPatch && len(f.patches) == 0 {
				f.rv, f.unschedulable = 2, true
			}
		}
		r, err := newCordoner(t, serve(t, f)).Attempt(context.Background())
		if r != OperatorCordon || err != nil || fmt.Sprint(f.methods) != "[GET PATCH GET]" || f.annotations != nil {
			t.Fatalf("%q %v, requests %v, annotations %v", r, err, f.methods, f.annotations)
		}
	})
	t.Run("labels changed meanwhile", func(t *testing.T) {
		f := &fakeAPI{rv: 1}
		f.before = func(f *fakeAPI, r *http.Request) {
			if r.Method == http.MethodPatch && len(f.patches) == 0 {
				f.rv = 2
			}
		}
		r, err := newCordoner(t, serve(t, f)).Attempt(context.Background())
		if r != Cordoned || err != nil || fmt.Sprint(f.methods) != "[GET PATCH GET PATCH]" || !f.unschedulable {
			t.Fatalf("%q %v, requests %v", r, err, f.methods)
		}
		if rv := f.patches[1]["metadata"].(map[string]any)["resourceVersion"]; rv != "2" {
			t.Fatalf("second patch at resourceVersion %v, want 2", rv)
		}
	})
	t.Run("always changing", func(t *testing.T) {
		f := &fakeAPI{rv: 1}
		f.before = func(f *fakeAPI, r *http.Request) {
			if r.Method == http.MethodPatch {
				f.rv++
			}
		}
		c := newCordoner(t, serve(t, f))
		if r, err := c.Attempt(context.Background()); !errors.Is(err, ErrConflict) || r != "" || len(f.patches) != conflictRetries {
			t.Fatalf("%q %v after %d patches", r, err, len(f.patches))
		}
		if c.Cordon(context.Background()) {
			t.Fatal("a failed attempt reported done")
		}
	})
}

// NodeRestriction's refusal is reported with the API server's reason and
// message, and the attempt is not done (retried later).
func TestForbiddenIsReported(t *testing.T) {
	msg := `nodes "worker-1" is forbidden: node "worker-1" is not allowed to modify taints`
	f := &fakeAPI{respond: map[string]func(http.ResponseWriter){
		http.MethodPatch: func(w http.ResponseWriter) { writeStatus(w, http.StatusForbidden, "Forbidden", msg) }}}
	c := newCordoner(t, serve(t, f))
	_, err := c.Attempt(context.Background())
	if want := "cordon: patch node worker-1: HTTP 403 Forbidden: " + msg; err == nil || err.Error() != want {
		t.Fatalf("error %v, want %s", err, want)
	}
	// A 403 whose body is not a Status is not echoed.
	f.respond[http.MethodPatch] = func(w http.ResponseWriter) { http.Error(w, "<html>denied</html>", http.StatusForbidden) }
	if _, err := c.Attempt(context.Background()); err == nil || err.Error() != "cordon: patch node worker-1: HTTP 403" {
		t.Fatalf("error %v", err)
	}
}

// Responses that are too big, malformed, or not this Node are refused
// before anything is patched.
func TestBadResponsesRefused(t *testing.T) {
	big := func(w http.ResponseWriter) {
		_, _ = w.Write([]byte(`{"kind":"Node","metadata":{"name":"worker-1","resourceVersion":"1"},"pad":"`))
		_, _ = w.Write([]byte(strings.Repeat("a", MaxResponse)))
		_, _ = w.Write([]byte(`"}`))
	}
	cases := []struct {
		name string
		get  func(http.ResponseWriter)
		want string
	}{
		{"oversized", big, "cordon: get node worker-1: cordon: invalid response from the API server: over 4194304 bytes"},
		{"malformed", func(w http.ResponseWriter) { _, _ = w.Write([]byte(`{"kind":"Node",`)) },
			"cordon: get node worker-1: cordon: invalid response from the API server: unexpected end of JSON input"},
		{"another node", func(w http.ResponseWriter) {
			_, _ = w.Write([]byte(`{"kind":"Node","metadata":{"name":"worker-2","resourceVersion":"1"},"spec":{}}`))
		}, `cordon: get node worker-1: cordon: invalid response from the API server: not the node "worker-1" with a resourceVersion (kind "Node", name "worker-2")`},
		{"no resourceVersion", func(w http.ResponseWriter) {
			_, _ = w.Write([]byte(`{"kind":"Node","metadata":{"name":"worker-1"},"spec":{}}`))
		}, `cordon: get node worker-1: cordon: invalid response from the API server: not the node "worker-1" with a resourceVersion (kind "Node", name "worker-1")`},
		{"a Status with 200", func(w http.ResponseWriter) {
			_, _ = w.Write([]byte(`{"kind":"Status","metadata":{"name":"worker-1","resourceVersion":"1"}}`))
		}, `cordon: get node worker-1: cordon: invalid response from the API server: not the node "worker-1" with a resourceVersion (kind "Status", name "worker-1")`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeAPI{respond: map[string]func(http.ResponseWriter){http.MethodGet: c.get}}
			_, err := newCordoner(t, serve(t, f)).Attempt(context.Background())
			if err == nil || err.Error() != c.want || !errors.Is(err, ErrBadResponse) || len(f.patches) != 0 {
				t.Fatalf("error %v, want %s (patches %d)", err, c.want, len(f.patches))
			}
		})
	}
	// A patch answered by a Node that is not cordoned is not taken as done.
	f := &fakeAPI{respond: map[string]func(http.ResponseWriter){http.MethodPatch: func(w http.ResponseWriter) {
		_, _ = w.Write([]byte(`{"kind":"Node","metadata":{"name":"worker-1","resourceVersion":"9"},"spec":{}}`))
	}}}
	_, err := newCordoner(t, serve(t, f)).Attempt(context.Background())
	if want := "cordon: patch node worker-1: cordon: invalid response from the API server: the patched node is not cordoned"; err == nil || err.Error() != want {
		t.Fatalf("error %v, want %s", err, want)
	}
}

// The API server must prove itself with the kubeconfig's CA: one that
// cannot is never sent the request.
func TestServerVerifiedAgainstTheKubeconfigCA(t *testing.T) {
	f := &fakeAPI{}
	other := pkitest.NewCA(t, "someone else")
	srv := httptest.NewTLSServer(f)
	defer srv.Close()
	client := pkitest.Issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "system:node:" + testNode}}, other)
	// The kubeconfig names srv but trusts another CA.
	bad := WriteKubeletConfig(t, t.TempDir(), srv.URL, other.Cert.Raw, client)
	_, err := newCordoner(t, bad).Attempt(context.Background())
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) || len(f.methods) != 0 {
		t.Fatalf("error %v, requests %v", err, f.methods)
	}
}

// The API server down (a whole-cluster power loss) fails the attempt at
// once: it is retried before the next re-attestation.
func TestAPIServerDown(t *testing.T) {
	f := &fakeAPI{}
	ca := pkitest.NewCA(t, "kubernetes")
	srv := httptest.NewTLSServer(f)
	url := srv.URL
	srv.Close()
	kc := WriteKubeletConfig(t, t.TempDir(), url, ca.Cert.Raw, pkitest.Issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "n"}}, ca))
	c := newCordoner(t, kc)
	if c.Cordon(context.Background()) || c.Cordoned() {
		t.Fatal("done with no API server")
	}
	if _, err := c.Attempt(context.Background()); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("error %v", err)
	}
}

// A kubeconfig that does not resolve is an error, never a request to an
// unverified server.
func TestKubeconfigRefusals(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "kc")
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct{ kc, want string }{
		{"current-context: x\n", `current context "x" not found`},
		{"current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\nclusters: [{name: k, cluster: {server: 'http://h:6443', certificate-authority-data: ''}}]\n",
			`server "http://h:6443" is not an https URL`},
		{"current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\nclusters: [{name: k, cluster: {server: 'https://h:6443'}}]\n",
			"certificate authority: neither data nor a file"},
	}
	for _, c := range cases {
		_, err := loadKubeconfig(write(c.kc))
		if err == nil || !strings.HasSuffix(err.Error(), c.want) {
			t.Errorf("%q: error %v, want …%s", c.kc, err, c.want)
		}
	}
}
