package app

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchkey/latchkey/verifier/token"
)

// The API rate bound: zero is the default, negative is refused.
func TestKubernetesAPIQPS(t *testing.T) {
	c := &Config{ClusterSalt: "a", Policy: "p", Kubernetes: &Kubernetes{APIQPS: -1}}
	c.Defaults()
	if err := c.Validate(); err == nil || err.Error() != "kubernetes.apiQPS -1, apiBurst 0: want 0 (default) or more" {
		t.Fatalf("negative apiQPS: %v", err)
	}
	if got := tokenTTL(&Kubernetes{}); got != token.DefaultTTL {
		t.Fatalf("default token TTL %s", got)
	}
}

// The verifier's client speaks protobuf to the API server, as the
// controller-manager does (client-go's generated clients prefer it for
// built-in types, and nothing here may turn that off): a written object
// goes as protobuf (its magic prefix "k8s\x00"), and protobuf is the
// answer it asks for first. JSON would cost the verifier and the API
// server several times the encoding per request and per watch event.
func TestKubeClientSpeaksProtobuf(t *testing.T) {
	type seen struct{ contentType, accept, body string }
	got := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(io.LimitReader(r.Body, 64))
		select {
		case got <- seen{r.Header.Get("Content-Type"), r.Header.Get("Accept"), string(b)}:
		default:
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403}`)
	}))
	defer srv.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	conf := "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: " + srv.URL + "}}]\n" +
		"users: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
	if err := os.WriteFile(kubeconfig, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := kubeClient(&Kubernetes{Kubeconfig: kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "x"}}
	_, err = c.CoreV1().Secrets("kube-system").Create(context.Background(), s, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("create against the recording server: %v", err)
	}
	r := <-got
	if r.contentType != "application/vnd.kubernetes.protobuf" || !strings.HasPrefix(r.body, "k8s\x00") {
		t.Fatalf("request body %q as %q, want protobuf", r.body, r.contentType)
	}
	if r.accept != "application/vnd.kubernetes.protobuf,application/json" {
		t.Fatalf("Accept %q, want protobuf first, then JSON", r.accept)
	}
}
