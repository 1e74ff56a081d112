package storm

// What the kubelet does with latchkey's ticket: TLS bootstrap with the
// bootstrap token (client-go's certificate/csr helpers, as kubelet's
// bootstrap does), then the Node registered and a Ready heartbeat with
// the issued client certificate.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// kubeletBootstrap runs the kubelet's part of a join with the ticket: the
// API server and CA from the ticket (file discovery), the client CSR for
// system:node:<node> in O=system:nodes made with the bootstrap token,
// the wait for its certificate, then the Node's creation and status with
// that certificate. issued is called when the certificate arrives, waited
// for each time the API server did not know the token yet.
func kubeletBootstrap(ctx context.Context, tk *latchkeyv1.Ticket, node string, issued, waited func()) (time.Time, error) {
	eps, ca := tk.GetApiServerEndpoints(), tk.GetCaBundle()
	if len(eps) == 0 || len(ca) == 0 || tk.GetToken() == "" {
		return time.Time{}, errors.New("ticket carries no endpoint, CA bundle or token")
	}
	host := "https://" + eps[0]
	boot, err := kubernetes.NewForConfig(&rest.Config{Host: host, BearerToken: tk.GetToken(),
		TLSClientConfig: rest.TLSClientConfig{CAData: ca}, QPS: -1, UserAgent: "latchkey-storm-kubelet"})
	if err != nil {
		return time.Time{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return time.Time{}, err
	}
	subject := &pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}
	csrPEM, err := cert.MakeCSR(key, subject, nil, nil)
	if err != nil {
		return time.Time{}, err
	}
	usages := []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}
	var name string
	var uid types.UID
	deadline := time.Now().Add(time.Minute)
	for try, backoff := 0, 50*time.Millisecond; ; try, backoff = try+1, min(2*backoff, time.Second) {
		name, uid, err = csr.RequestCertificateWithContext(ctx, boot, csrPEM, csrName(key, node),
			certv1.KubeAPIServerClientKubeletSignerName, nil, usages, key)
		if err == nil || time.Now().After(deadline) {
			break
		}
		// Not known yet: wait. Known by now: the refusal may still have
		// been that moment's, so one more try; after that it is real.
		if tokenNotKnownYet(ctx, boot) {
			waited()
		} else if try > 0 {
			break
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("request client certificate: %w", err)
		case <-time.After(backoff):
		}
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("request client certificate: %w", err)
	}
	certPEM, err := csr.WaitForCertificate(ctx, boot, name, uid)
	if err != nil {
		return time.Time{}, fmt.Errorf("wait for client certificate %s: %w", name, err)
	}
	at := time.Now()
	issued()
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return at, err
	}
	kc, err := kubernetes.NewForConfig(&rest.Config{Host: host, QPS: -1, UserAgent: "latchkey-storm-kubelet",
		TLSClientConfig: rest.TLSClientConfig{CAData: ca, CertData: certPEM,
			KeyData: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})}})
	if err != nil {
		return at, err
	}
	n, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{})
	if err != nil {
		return at, fmt.Errorf("register node: %w", err)
	}
	// The Ready heartbeat, patched into the status as the kubelet does
	// (other controllers write the new Node too: no conflict to retry).
	now := metav1.Now().UTC().Format(time.RFC3339)
	patch := fmt.Sprintf(`{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady",`+
		`"message":"latchkey storm","lastHeartbeatTime":%q,"lastTransitionTime":%q}]}}`, now, now)
	if _, err := kc.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		return at, fmt.Errorf("node status: %w", err)
	}
	return at, nil
}

// tokenNotKnownYet reports whether the API server refuses boot's token
// as unknown. A token Secret reaches the API server's authenticator
// through its informer, a moment after the write returned; the kubelet
// waits for the server with its bootstrap credentials (kubelet's
// waitForServer) and kubeadm retries, so the simulated kubelet does too.
func tokenNotKnownYet(ctx context.Context, boot kubernetes.Interface) bool {
	_, err := boot.Discovery().RESTClient().Get().AbsPath("/version").DoRaw(ctx)
	return apierrors.IsUnauthorized(err)
}

// csrName is the kubelet's kind of name: node-csr- and a digest of the
// key and subject.
func csrName(key *ecdsa.PrivateKey, node string) string {
	pub, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	h := sha256.New()
	h.Write(pub)
	h.Write([]byte(node))
	return "node-csr-" + hex.EncodeToString(h.Sum(nil))[:32]
}
