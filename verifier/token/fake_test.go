package token

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"sync"
	"testing"

	"github.com/latchkey/latchkey/internal/pkitest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	"k8s.io/cluster-bootstrap/token/jws"
)

// signMode is how the fake bootstrap signer behaves.
type signMode int

const (
	signOnCreate    signMode = iota // sign cluster-info as the Secret is created
	signOnWatch                     // sign only once someone watches cluster-info
	signNever                       // never sign (signer down)
	signWrongSecret                 // sign with a secret other than the token's
)

// fakeCluster is a fake clientset with a published cluster-info and a
// bootstrap signer stand-in.
type fakeCluster struct {
	client *fake.Clientset
	cas    []*x509.Certificate
	mode   signMode
	mu     sync.Mutex
}

// newFakeCluster publishes cluster-info for server with nCAs CAs.
func newFakeCluster(t *testing.T, server string, nCAs int, mode signMode) *fakeCluster {
	t.Helper()
	fc := &fakeCluster{mode: mode}
	var bundle []byte
	for i := 0; i < nCAs; i++ {
		c := pkitest.NewCA(t, "kubernetes").Cert
		fc.cas = append(fc.cas, c)
		bundle = append(bundle, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters[""] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: bundle}
	raw, err := clientcmd.Write(*kc)
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: bootstrapapi.ConfigMapClusterInfo, Namespace: metav1.NamespacePublic},
		Data:       map[string]string{bootstrapapi.KubeConfigKey: string(raw)},
	}
	fc.client = fake.NewClientset(cm)
	fc.client.PrependReactor("create", "secrets", fc.onCreate)
	fc.client.PrependWatchReactor("configmaps", fc.onWatch)
	return fc
}

func (fc *fakeCluster) onCreate(a k8stesting.Action) (bool, runtime.Object, error) {
	s, ok := a.(k8stesting.CreateAction).GetObject().(*corev1.Secret)
	if !ok || s.Type != bootstrapapi.SecretTypeBootstrapToken {
		return false, nil, nil
	}
	if fc.mode == signOnCreate || fc.mode == signWrongSecret {
		fc.sign(s)
	}
	return false, nil, nil
}

func (fc *fakeCluster) onWatch(a k8stesting.Action) (bool, watch.Interface, error) {
	w, err := fc.client.Tracker().Watch(a.GetResource(), a.GetNamespace())
	if err != nil || fc.mode != signOnWatch {
		return true, w, err
	}
	// The watch is registered with the tracker, so a signature written
	// from now on is queued on it (a buffered channel) for the client,
	// however soon the signing runs.
	go func() {
		secrets, _ := fc.client.Tracker().List(corev1.SchemeGroupVersion.WithResource("secrets"),
			corev1.SchemeGroupVersion.WithKind("Secret"), metav1.NamespaceSystem)
		for _, s := range secrets.(*corev1.SecretList).Items {
			fc.sign(&s)
		}
	}()
	return true, w, nil
}

// sign adds the JWS signature of s's token to cluster-info, through the
// tracker so no reactor runs again.
func (fc *fakeCluster) sign(s *corev1.Secret) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	gvr := corev1.SchemeGroupVersion.WithResource("configmaps")
	obj, err := fc.client.Tracker().Get(gvr, metav1.NamespacePublic, bootstrapapi.ConfigMapClusterInfo)
	if err != nil {
		panic(err)
	}
	cm := obj.(*corev1.ConfigMap).DeepCopy()
	id := string(s.Data[bootstrapapi.BootstrapTokenIDKey])
	secret := string(s.Data[bootstrapapi.BootstrapTokenSecretKey])
	if fc.mode == signWrongSecret {
		secret = "0123456789abcdef"
	}
	sig, err := jws.ComputeDetachedSignature(cm.Data[bootstrapapi.KubeConfigKey], id, secret)
	if err != nil {
		panic(err)
	}
	cm.Data[bootstrapapi.JWSSignatureKeyPrefix+id] = sig
	if err := fc.client.Tracker().Update(gvr, cm, metav1.NamespacePublic); err != nil {
		panic(err)
	}
}

// secrets lists the Secrets in kube-system.
func (fc *fakeCluster) secrets(t *testing.T) []corev1.Secret {
	t.Helper()
	l, err := fc.client.CoreV1().Secrets(metav1.NamespaceSystem).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}
