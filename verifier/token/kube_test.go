package token

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"
	cryptoutil "k8s.io/kubernetes/cmd/kubeadm/app/util/crypto"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

var testNow = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// countingReader yields 0, 1, 2, ... so token IDs are predictable.
type countingReader struct{ n byte }

func (c *countingReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = c.n
		c.n++
	}
	return len(p), nil
}

const testDigest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"

func workerReq(node string) Request {
	return Request{NodeName: node, Role: latchkeyv1.Role_ROLE_WORKER, EvidenceDigest: testDigest}
}

func newTestKube(t *testing.T, fc *fakeCluster, mod func(*KubeConfig)) *Kube {
	t.Helper()
	cfg := KubeConfig{
		Client:        fc.client,
		Now:           func() time.Time { return testNow },
		Rand:          &countingReader{},
		SignatureWait: 2 * time.Second,
		Logger:        slog.New(slog.DiscardHandler),
	}
	if mod != nil {
		mod(&cfg)
	}
	k, err := NewKube(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func pin(t *testing.T, fc *fakeCluster, i int) string {
	sum := sha256.Sum256(fc.cas[i].RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func TestMintWorkerSecretShape(t *testing.T) {
	fc := newFakeCluster(t, "https://10.0.0.1:6443", 1, signOnCreate)
	g, err := newTestKube(t, fc, nil).Mint(context.Background(), workerReq("node-a.example"))
	if err != nil {
		t.Fatal(err)
	}
	// countingReader: ID from bytes 0..5, secret from bytes 12..27.
	if g.ID != "012345" || g.Token != "012345.cdefghijklmnopqr" {
		t.Fatalf("grant ID/token = %q/%q", g.ID, g.Token)
	}
	secrets := fc.secrets(t)
	if len(secrets) != 1 {
		t.Fatalf("%d secrets, want 1", len(secrets))
	}
	s := secrets[0]
	want := corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      "bootstrap-token-012345",
			Namespace: "kube-system",
			Labels: map[string]string{
				"app.kubernetes.io/managed-by": "latchkey",
				"latchkey.io/node-hash":        NodeHash("node-a.example"),
				"latchkey.io/role":             "worker",
			},
			Annotations: map[string]string{
				"latchkey.io/node-name":       "node-a.example",
				"latchkey.io/evidence-digest": testDigest,
			},
		},
		Type: "bootstrap.kubernetes.io/token",
		Data: map[string][]byte{
			"token-id":                       []byte("012345"),
			"token-secret":                   []byte("cdefghijklmnopqr"),
			"expiration":                     []byte("2026-11-29T12:30:00Z"),
			"usage-bootstrap-authentication": []byte("true"),
			"auth-extra-groups":              []byte("system:bootstrappers:latchkey,system:bootstrappers:latchkey:node:" + NodeHash("node-a.example")),
			"description":                    []byte("latchkey worker token for node node-a.example, evidence " + testDigest),
		},
	}
	s.TypeMeta, s.ResourceVersion, s.ManagedFields = metav1.TypeMeta{}, "", nil
	if !reflect.DeepEqual(s, want) {
		t.Fatalf("secret =\n%+v\nwant\n%+v", s, want)
	}
	if !g.Expiry.Equal(testNow.Add(30*time.Minute)) || g.CertificateKey != "" {
		t.Fatalf("expiry %v certificate key %q", g.Expiry, g.CertificateKey)
	}
	if !reflect.DeepEqual(g.Endpoints, []string{"10.0.0.1:6443"}) || !reflect.DeepEqual(g.CACertHashes, []string{pin(t, fc, 0)}) {
		t.Fatalf("endpoints %v hashes %v", g.Endpoints, g.CACertHashes)
	}
	wantBundle := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: fc.cas[0].Raw})
	if !bytes.Equal(g.CABundle, wantBundle) {
		t.Fatalf("ticket CA bundle\n%s\nwant\n%s", g.CABundle, wantBundle)
	}
}

// Token discovery (the legacy mode) mints signing tokens, waits for the
// JWS and sends no bundle.
func TestMintTokenDiscoverySigningToken(t *testing.T) {
	fc := newFakeCluster(t, "https://10.0.0.1:6443", 1, signOnCreate)
	g, err := newTestKube(t, fc, func(c *KubeConfig) { c.TokenDiscovery = true }).Mint(context.Background(), workerReq("n1"))
	if err != nil {
		t.Fatal(err)
	}
	s := fc.secrets(t)[0]
	if string(s.Data["usage-bootstrap-signing"]) != "true" || g.CABundle != nil {
		t.Fatalf("signing usage %q, bundle %d bytes", s.Data["usage-bootstrap-signing"], len(g.CABundle))
	}
}

// File discovery never waits for a signature: a cluster whose signer
// never signs still gets its tokens at once.
func TestMintFileDiscoveryNeedsNoSignature(t *testing.T) {
	fc := newFakeCluster(t, "https://cp.example:6443", 2, signNever)
	g, err := newTestKube(t, fc, func(c *KubeConfig) { c.SignatureWait = time.Hour }).Mint(context.Background(), workerReq("n1"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(g.CABundle), "BEGIN CERTIFICATE"); n != 2 {
		t.Fatalf("bundle holds %d certificates, want both CAs of the rotation", n)
	}
}

// A configured pin list narrows the bundle; a pin list that matches no
// CA of cluster-info is refused rather than sending an unusable ticket.
func TestMintFileDiscoveryBundleFollowsConfiguredPins(t *testing.T) {
	fc := newFakeCluster(t, "https://cp.example:6443", 2, signNever)
	g, err := newTestKube(t, fc, func(c *KubeConfig) { c.CACertHashes = []string{pin(t, fc, 1)} }).Mint(context.Background(), workerReq("n1"))
	if err != nil {
		t.Fatal(err)
	}
	if want := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: fc.cas[1].Raw}); !bytes.Equal(g.CABundle, want) {
		t.Fatalf("bundle is not just the pinned CA:\n%s", g.CABundle)
	}
	_, err = newTestKube(t, fc, func(c *KubeConfig) { c.CACertHashes = []string{"sha256:" + strings.Repeat("ab", 32)} }).Mint(context.Background(), workerReq("n2"))
	if err == nil || !strings.Contains(err.Error(), "no certificate of cluster-info's CA bundle matches the configured CA cert hashes") {
		t.Fatalf("err = %v", err)
	}
}

func TestNodeHashIsAValidGroupSuffix(t *testing.T) {
	for _, n := range []string{"a", "node-1.cluster.example", strings.Repeat("x", 253)} {
		if err := bootstraputil.ValidateBootstrapGroupName(NodeGroup(n)); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
	for _, g := range []string{Group, ControlPlaneGroup} {
		if err := bootstraputil.ValidateBootstrapGroupName(g); err != nil {
			t.Errorf("%s: %v", g, err)
		}
	}
}

func TestRandomTokensAreValid(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		id, secret, err := newTokenPair(nil)
		if err != nil {
			t.Fatal(err)
		}
		tok := id + "." + secret
		if !bootstraputil.IsValidBootstrapToken(tok) || !ValidID(id) {
			t.Fatalf("invalid token %q", id)
		}
		if seen[tok] {
			t.Fatalf("token repeated")
		}
		seen[tok] = true
	}
}

func TestRandomStringRejectsBiasedBytes(t *testing.T) {
	// 252..255 would map to 0..3 and bias the alphabet; they must be skipped.
	r := strings.NewReader(string([]byte{252, 253, 254, 255, 35, 0, 1, 2, 3, 4, 5, 6}))
	s, err := randomString(r, 2)
	if err != nil {
		t.Fatal(err)
	}
	if s != "z0" {
		t.Fatalf("got %q, want z0 (bytes >= 252 skipped)", s)
	}
}

func TestMintRotationReturnsEveryCAPin(t *testing.T) {
	fc := newFakeCluster(t, "https://cp.example:6443", 2, signOnCreate)
	g, err := newTestKube(t, fc, nil).Mint(context.Background(), workerReq("n1"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{pin(t, fc, 0), pin(t, fc, 1)}
	if !reflect.DeepEqual(g.CACertHashes, want) {
		t.Fatalf("hashes %v, want %v", g.CACertHashes, want)
	}
}

func TestMintConfiguredEndpointsAndPins(t *testing.T) {
	fc := newFakeCluster(t, "https://cp.example:6443", 1, signOnCreate)
	pins := []string{"sha256:" + strings.Repeat("ab", 32)}
	k := newTestKube(t, fc, func(c *KubeConfig) {
		c.TokenDiscovery = true // file discovery also needs the pinned CA in cluster-info
		c.Endpoints = []string{"lb.example:443", "10.1.1.1:6443"}
		c.CACertHashes = pins
	})
	g, err := k.Mint(context.Background(), workerReq("n1"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g.Endpoints, []string{"lb.example:443", "10.1.1.1:6443"}) || !reflect.DeepEqual(g.CACertHashes, pins) {
		t.Fatalf("endpoints %v hashes %v", g.Endpoints, g.CACertHashes)
	}
}

func TestNewKubeRefusesBadPin(t *testing.T) {
	fc := newFakeCluster(t, "https://cp.example:6443", 1, signOnCreate)
	_, err := NewKube(KubeConfig{Client: fc.client, CACertHashes: []string{"md5:abc"}})
	if err == nil || !strings.Contains(err.Error(), "md5:abc") {
		t.Fatalf("err = %v", err)
	}
	if _, err := NewKube(KubeConfig{}); err == nil {
		t.Fatal("no client accepted")
	}
}

func TestMintWaitsForSignatureThroughWatch(t *testing.T) {
	fc := newFakeCluster(t, "https://cp.example:6443", 1, signOnWatch)
	g, err := newTestKube(t, fc, func(c *KubeConfig) { c.TokenDiscovery = true }).Mint(context.Background(), workerReq("n1"))
	if err != nil {
		t.Fatal(err)
	}
	if g.ID == "" || len(fc.secrets(t)) != 1 {
		t.Fatalf("grant %+v", g)
	}
}

func TestMintSignatureTimeoutDeletesToken(t *testing.T) {
	for _, mode := range []signMode{signNever, signWrongSecret} {
		fc := newFakeCluster(t, "https://cp.example:6443", 1, mode)
		k := newTestKube(t, fc, func(c *KubeConfig) { c.TokenDiscovery, c.SignatureWait = true, 100*time.Millisecond })
		g, err := k.Mint(context.Background(), workerReq("n1"))
		if !errors.Is(err, ErrNotSigned) || g != nil {
			t.Fatalf("mode %d: grant %v err %v, want ErrNotSigned", mode, g, err)
		}
		if n := len(fc.secrets(t)); n != 0 {
			t.Fatalf("mode %d: %d secrets left behind", mode, n)
		}
	}
}

func TestMintRefusesBadRequests(t *testing.T) {
	fc := newFakeCluster(t, "https://cp.example:6443", 1, signOnCreate)
	k := newTestKube(t, fc, nil)
	bad := []Request{
		{NodeName: "", Role: latchkeyv1.Role_ROLE_WORKER},
		{NodeName: "Upper_Case", Role: latchkeyv1.Role_ROLE_WORKER},
		{NodeName: strings.Repeat("a", 254), Role: latchkeyv1.Role_ROLE_WORKER},
		{NodeName: "ok", Role: latchkeyv1.Role_ROLE_UNSPECIFIED},
		{NodeName: "ok", Role: latchkeyv1.Role_ROLE_WORKER, EvidenceDigest: "x\ny"},
	}
	for _, r := range bad {
		if _, err := k.Mint(context.Background(), r); !errors.Is(err, ErrBadRequest) {
			t.Errorf("%+v: err = %v, want ErrBadRequest", r, err)
		}
	}
	if n := len(fc.secrets(t)); n != 0 {
		t.Fatalf("%d secrets written for bad requests", n)
	}
}

func TestMintCreateFailureRevokesNothing(t *testing.T) {
	fc := newFakeCluster(t, "https://cp.example:6443", 1, signOnCreate)
	deletes := 0
	fc.client.PrependReactor("create", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "x", errors.New("rbac"))
	})
	fc.client.PrependReactor("delete", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		deletes++
		return false, nil, nil
	})
	_, err := newTestKube(t, fc, nil).Mint(context.Background(), workerReq("n1"))
	if !apierrors.IsForbidden(err) {
		t.Fatalf("err = %v, want the Forbidden of the create", err)
	}
	if deletes != 0 {
		t.Fatalf("%d deletes after a failed create", deletes)
	}
}

func TestMintRetriesTakenTokenID(t *testing.T) {
	fc := newFakeCluster(t, "https://cp.example:6443", 1, signOnCreate)
	taken := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-012345", Namespace: "kube-system"}}
	if _, err := fc.client.CoreV1().Secrets("kube-system").Create(context.Background(), taken, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	g, err := newTestKube(t, fc, nil).Mint(context.Background(), workerReq("n1"))
	if err != nil {
		t.Fatal(err)
	}
	if g.ID == "012345" {
		t.Fatal("taken ID reused")
	}
}

// writePKI writes stand-ins for the shared control-plane files.
func writePKI(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "etcd"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, n := range sharedCerts {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("content of "+n), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestMintControlPlaneUploadsOwnedCerts(t *testing.T) {
	fc := newFakeCluster(t, "https://cp.example:6443", 1, signOnCreate)
	k := newTestKube(t, fc, func(c *KubeConfig) { c.CertificatesDir = writePKI(t) })
	req := Request{NodeName: "cp-2", Role: latchkeyv1.Role_ROLE_CONTROL_PLANE, EvidenceDigest: testDigest}
	g, err := k.Mint(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	// kubeadm's format: 32 random bytes as 64 lower-case hex digits.
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(g.CertificateKey) {
		t.Fatalf("certificate key is not 64 lower-case hex digits (%d characters)", len(g.CertificateKey))
	}
	key, err := hex.DecodeString(g.CertificateKey)
	if err != nil || len(key) != 32 {
		t.Fatalf("certificate key %d bytes, err %v", len(key), err)
	}
	certs, err := fc.client.CoreV1().Secrets("kube-system").Get(context.Background(), "kubeadm-certs", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(certs.OwnerReferences) != 1 || certs.OwnerReferences[0].Name != "bootstrap-token-"+g.ID {
		t.Fatalf("owners %+v", certs.OwnerReferences)
	}
	if len(certs.Data) != len(sharedCerts) {
		t.Fatalf("%d entries, want %d", len(certs.Data), len(sharedCerts))
	}
	plain, err := cryptoutil.DecryptBytes(certs.Data["etcd-ca.key"], key)
	if err != nil || string(plain) != "content of etcd/ca.key" {
		t.Fatalf("decrypt: %q %v", plain, err)
	}
	tok, _ := fc.client.CoreV1().Secrets("kube-system").Get(context.Background(), "bootstrap-token-"+g.ID, metav1.GetOptions{})
	if groups := string(tok.Data["auth-extra-groups"]); !strings.HasSuffix(groups, ","+ControlPlaneGroup) {
		t.Fatalf("groups %q lack the control-plane group", groups)
	}
	if err := k.Revoke(context.Background(), g.ID); err != nil {
		t.Fatal(err)
	}
	if n := len(fc.secrets(t)); n != 0 {
		t.Fatalf("%d secrets after revoke, want 0", n)
	}
}

func TestMintControlPlaneRefusedWithoutPKI(t *testing.T) {
	fc := newFakeCluster(t, "https://cp.example:6443", 1, signOnCreate)
	req := Request{NodeName: "cp-2", Role: latchkeyv1.Role_ROLE_CONTROL_PLANE}
	if _, err := newTestKube(t, fc, nil).Mint(context.Background(), req); !errors.Is(err, ErrControlPlaneDisabled) {
		t.Fatalf("err = %v", err)
	}
	if n := len(fc.secrets(t)); n != 0 {
		t.Fatalf("%d secrets", n)
	}
}

func TestRevoke(t *testing.T) {
	fc := newFakeCluster(t, "https://cp.example:6443", 1, signOnCreate)
	k := newTestKube(t, fc, nil)
	g, err := k.Mint(context.Background(), workerReq("n1"))
	if err != nil {
		t.Fatal(err)
	}
	other := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "kubeadm-certs", Namespace: "kube-system",
		OwnerReferences: []metav1.OwnerReference{{Kind: "Secret", Name: "bootstrap-token-zzzzzz"}}}}
	if _, err := fc.client.CoreV1().Secrets("kube-system").Create(context.Background(), other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := k.Revoke(context.Background(), g.ID); err != nil {
		t.Fatal(err)
	}
	left := fc.secrets(t)
	if len(left) != 1 || left[0].Name != "kubeadm-certs" {
		t.Fatalf("left %v, want only the kubeadm-certs another token owns", left)
	}
	if err := k.Revoke(context.Background(), g.ID); err != nil {
		t.Fatalf("second revoke: %v", err)
	}
	if err := k.Revoke(context.Background(), "../etc"); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("bad id: %v", err)
	}
}

// Record sees the token's ID while the mint waits for the signature; a
// failed Record fails the mint and leaves no token behind.
func TestMintRecordsTokenID(t *testing.T) {
	fc := newFakeCluster(t, "https://cp.example:6443", 1, signOnWatch)
	var seen string
	req := workerReq("n1")
	req.Record = func(_ context.Context, id string) error { seen = id; return nil }
	g, err := newTestKube(t, fc, nil).Mint(context.Background(), req)
	if err != nil || seen == "" || seen != g.ID {
		t.Fatalf("recorded %q, grant %+v, err %v", seen, g, err)
	}

	fc = newFakeCluster(t, "https://cp.example:6443", 1, signOnWatch)
	req.Record = func(context.Context, string) error { return errors.New("lease update conflict") }
	g, err = newTestKube(t, fc, nil).Mint(context.Background(), req)
	if err == nil || g != nil || !strings.Contains(err.Error(), "record token: lease update conflict") {
		t.Fatalf("grant %v err %v, want the record failure", g, err)
	}
	if n := len(fc.secrets(t)); n != 0 {
		t.Fatalf("%d secrets left behind after a failed record", n)
	}
}

// TestRevokePresentTellsWhetherTheTokenWasThere: the reaper counts a
// token deleted after use only when it was still there to delete.
func TestRevokePresentTellsWhetherTheTokenWasThere(t *testing.T) {
	fc := newFakeCluster(t, "https://cp.example:6443", 1, signOnCreate)
	k := newTestKube(t, fc, nil)
	g, err := k.Mint(context.Background(), workerReq("n1"))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		present, err := k.RevokePresent(context.Background(), g.ID)
		if err != nil || present != want {
			t.Fatalf("revoke %d: present %v, err %v; want %v", i+1, present, err, want)
		}
	}
	if _, err := k.RevokePresent(context.Background(), "BAD"); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("bad id: err = %v", err)
	}
}

// Revoking a worker token this minter made reads no kubeadm-certs (a
// worker token never owns it). A token it did not make, here a
// control-plane token another replica minted, still has its certificates
// deleted with it.
func TestRevokeReadsCertsOnlyForTokensItMayOwn(t *testing.T) {
	fc := newFakeCluster(t, "https://cp.example:6443", 1, signOnCreate)
	ctx := context.Background()
	k := newTestKube(t, fc, nil)
	g, err := k.Mint(ctx, workerReq("n1"))
	if err != nil {
		t.Fatal(err)
	}
	certReads := func() int {
		n := 0
		for _, a := range fc.client.Actions() {
			if g, ok := a.(k8stesting.GetAction); ok && a.GetVerb() == "get" && a.GetResource().Resource == "secrets" && g.GetName() == "kubeadm-certs" {
				n++
			}
		}
		return n
	}
	before := certReads()
	if err := k.Revoke(ctx, g.ID); err != nil {
		t.Fatal(err)
	}
	if n := certReads() - before; n != 0 {
		t.Fatalf("revoking its own worker token read kubeadm-certs %d times", n)
	}

	replica := newTestKube(t, fc, func(c *KubeConfig) {
		c.CertificatesDir = writePKI(t)
		c.Rand = &countingReader{n: 100}
	})
	cp, err := replica.Mint(ctx, Request{NodeName: "cp-2", Role: latchkeyv1.Role_ROLE_CONTROL_PLANE, EvidenceDigest: testDigest})
	if err != nil {
		t.Fatal(err)
	}
	before = certReads()
	if err := k.Revoke(ctx, cp.ID); err != nil {
		t.Fatal(err)
	}
	if n := certReads() - before; n != 1 {
		t.Fatalf("revoking another replica's token read kubeadm-certs %d times, want 1", n)
	}
	if left := fc.secrets(t); len(left) != 0 {
		t.Fatalf("left %v: the control-plane token's certificates must go with it", left)
	}
}
