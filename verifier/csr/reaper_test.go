package csr

import (
	"context"
	"sync"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

type recordingRevoker struct {
	mu  sync.Mutex
	ids []string
}

func (r *recordingRevoker) Revoke(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ids = append(r.ids, id)
	return nil
}

func (r *recordingRevoker) revoked() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.ids...)
}

// issuedCSR is a latchkey kubelet client CSR for node, made with token
// id, approved at t and with its certificate issued.
func issuedCSR(t *testing.T, node, id string, at time.Time) *certv1.CertificateSigningRequest {
	csr := latchkeyCSR(t, "csr-"+node, node, node)
	csr.Spec.Username = "system:bootstrap:" + id
	csr.Status.Conditions = []certv1.CertificateSigningRequestCondition{{Type: certv1.CertificateApproved,
		Status: corev1.ConditionTrue, LastUpdateTime: metav1.NewTime(at)}}
	csr.Status.Certificate = []byte("-----BEGIN CERTIFICATE-----\n")
	return csr
}

func newTestReaper(t *testing.T) (*Reaper, *recordingRevoker, *int) {
	t.Helper()
	rv := &recordingRevoker{}
	n := 0
	r, err := NewReaper(ReaperConfig{Client: fake.NewClientset(), Revoker: rv, OnReaped: func() { n++ }})
	if err != nil {
		t.Fatal(err)
	}
	return r, rv, &n
}

func TestReaperDeletesTokenOnceNodeRegistered(t *testing.T) {
	r, rv, reaped := newTestReaper(t)
	issuedAt := time.Now()
	r.ObserveCSR(issuedCSR(t, "node-1", "abcdef", issuedAt))
	// A Node that existed before the certificate (an old registration) and
	// has not reported since proves nothing: the token stays.
	old := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", CreationTimestamp: metav1.NewTime(issuedAt.Add(-time.Hour))}}
	r.ObserveNode(context.Background(), old)
	if len(rv.revoked()) != 0 {
		t.Fatalf("revoked %v before the node used its certificate", rv.revoked())
	}
	// Its kubelet reports with the new certificate: the token goes.
	old.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, LastHeartbeatTime: metav1.NewTime(issuedAt.Add(2 * time.Second))}}
	r.ObserveNode(context.Background(), old)
	if got := rv.revoked(); len(got) != 1 || got[0] != "abcdef" || *reaped != 1 {
		t.Fatalf("revoked %v (reaped %d), want [abcdef] once", got, *reaped)
	}
	r.ObserveNode(context.Background(), old)
	if len(rv.revoked()) != 1 {
		t.Fatal("a token was revoked twice")
	}
}

// TestReaperForgetsNothingOnResync: an informer resync shows the reaped
// token's CSR again (the measured e2e saw the token deleted and counted on
// every Node update after each 30 s resync); the token is deleted and
// counted once. A new token for the node (a rejoin) is reaped again.
func TestReaperForgetsNothingOnResync(t *testing.T) {
	r, rv, reaped := newTestReaper(t)
	at := time.Now()
	csr := issuedCSR(t, "node-1", "abcdef", at)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", CreationTimestamp: metav1.NewTime(at.Add(time.Second))}}
	for range 3 {
		r.ObserveCSR(csr)
		r.ObserveNode(context.Background(), n)
	}
	if got := rv.revoked(); len(got) != 1 || *reaped != 1 {
		t.Fatalf("revoked %v, counted %d: want abcdef once", got, *reaped)
	}
	again := issuedCSR(t, "node-1", "ghijkl", at.Add(time.Minute))
	r.ObserveCSR(again)
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, LastHeartbeatTime: metav1.NewTime(at.Add(2 * time.Minute))}}
	r.ObserveNode(context.Background(), n)
	if got := rv.revoked(); len(got) != 2 || got[1] != "ghijkl" || *reaped != 2 {
		t.Fatalf("revoked %v, counted %d: want abcdef, ghijkl", got, *reaped)
	}
	// Entries older than reapedKeep are forgotten.
	r.mu.Lock()
	r.lastPrune = time.Time{}
	r.pruneReaped(at.Add(reapedKeep + 2*time.Minute))
	left := len(r.reaped)
	r.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d reaped tokens remembered after %s", left, reapedKeep)
	}
}

// presentRevoker knows which tokens exist, as the API server does.
type presentRevoker struct {
	recordingRevoker
	live map[string]bool
}

func (p *presentRevoker) RevokePresent(ctx context.Context, id string) (bool, error) {
	_ = p.Revoke(ctx, id)
	p.mu.Lock()
	defer p.mu.Unlock()
	was := p.live[id]
	delete(p.live, id)
	return was, nil
}

// TestRestartedReaperCountsNothingTwice: a restarted verifier (a new
// reaper, empty memory) sees the old CSR and the Node again; the token is
// already gone, so it is not counted again.
func TestRestartedReaperCountsNothingTwice(t *testing.T) {
	rv := &presentRevoker{live: map[string]bool{"abcdef": true}}
	at := time.Now()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", CreationTimestamp: metav1.NewTime(at.Add(time.Second))}}
	total := 0
	for range 2 { // the first process, then the restarted one
		r, err := NewReaper(ReaperConfig{Client: fake.NewClientset(), Revoker: rv, OnReaped: func() { total++ }})
		if err != nil {
			t.Fatal(err)
		}
		r.ObserveCSR(issuedCSR(t, "node-1", "abcdef", at))
		r.ObserveNode(context.Background(), n)
	}
	if total != 1 {
		t.Fatalf("counted %d deletions of one token", total)
	}
}

func TestReaperIgnoresWhatIsNotAUsedLatchkeyToken(t *testing.T) {
	r, rv, _ := newTestReaper(t)
	now := time.Now()
	pending := issuedCSR(t, "node-2", "bbbbbb", now)
	pending.Status.Certificate = nil // approved, not yet issued
	r.ObserveCSR(pending)
	foreign := issuedCSR(t, "node-3", "cccccc", now)
	foreign.Spec.Groups = []string{"system:bootstrappers"} // not a latchkey token
	r.ObserveCSR(foreign)
	for _, n := range []string{"node-2", "node-3", "node-4"} {
		r.ObserveNode(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, CreationTimestamp: metav1.NewTime(now.Add(time.Minute))}})
	}
	if got := rv.revoked(); len(got) != 0 {
		t.Fatalf("revoked %v", got)
	}
}

// A deleted token is forgotten on its node's record, once.
func TestReaperForgetsDeletedToken(t *testing.T) {
	rv := &recordingRevoker{}
	var forgot []string
	r, err := NewReaper(ReaperConfig{Client: fake.NewClientset(), Revoker: rv,
		Forget: func(_ context.Context, node, id string) error { forgot = append(forgot, node+"/"+id); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	issuedAt := time.Now()
	r.ObserveCSR(issuedCSR(t, "node-1", "abcdef", issuedAt))
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", CreationTimestamp: metav1.NewTime(issuedAt.Add(time.Second))}}
	r.ObserveNode(context.Background(), n)
	r.ObserveNode(context.Background(), n)
	if len(forgot) != 1 || forgot[0] != "node-1/abcdef" {
		t.Fatalf("forgot %v, want [node-1/abcdef]", forgot)
	}
}
