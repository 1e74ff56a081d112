package reattest

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/latchkey/latchkey/internal/kubekey"
	"github.com/latchkey/latchkey/verifier/binding"
)

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func TestDecide(t *testing.T) {
	refused := &binding.Attestation{Time: t0, Decision: binding.DecisionRefused, Reason: "PCR_MISMATCH"}
	cases := []struct {
		name   string
		st     binding.NodeStatus
		now    time.Time
		want   State
		reason string
	}{
		{"fresh join", binding.NodeStatus{Renewed: t0}, t0.Add(time.Minute), Attested, "NONE"},
		{"silent past deadline", binding.NodeStatus{Renewed: t0}, t0.Add(31 * time.Minute), Stale, "DEADLINE_EXCEEDED"},
		{"never renewed", binding.NodeStatus{}, t0, Stale, "DEADLINE_EXCEEDED"},
		{"refused", binding.NodeStatus{Renewed: t0, Last: refused}, t0.Add(time.Second), Refused, "PCR_MISMATCH"},
		// A later join (token minted, renewTime moved on) supersedes the
		// refusal: the node rebooted into measurements the policy accepts.
		{"refusal superseded by a join", binding.NodeStatus{Renewed: t0.Add(time.Minute), Last: refused}, t0.Add(2 * time.Minute), Attested, "NONE"},
	}
	for _, c := range cases {
		if got, reason := Decide(c.st, c.now, DefaultDeadline); got != c.want || reason != c.reason {
			t.Errorf("%s: %s %s, want %s %s", c.name, got, reason, c.want, c.reason)
		}
	}
}

type statuses []binding.NodeStatus

func (s statuses) NodeStatuses(context.Context) ([]binding.NodeStatus, error) { return s, nil }

type counts struct{ a, s, r, o int }

func (c *counts) ReattestNodes(a, s, r, o int) { *c = counts{a, s, r, o} }

func taintOf(t *testing.T, c *fake.Clientset, node string) *corev1.Taint {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n.Spec.Taints {
		if n.Spec.Taints[i].Key == kubekey.TaintUnattested {
			return &n.Spec.Taints[i]
		}
	}
	return nil
}

func TestPassTaintsAndUntaintsKeepingOtherTaints(t *testing.T) {
	other := corev1.Taint{Key: "example.com/other", Effect: corev1.TaintEffectNoSchedule}
	c := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "good"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{other}}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "silent"}},
	)
	now := t0
	sts := statuses{
		{Node: "good", Identity: "x", Renewed: t0},
		{Node: "bad", Identity: "y", Renewed: t0, Last: &binding.Attestation{Time: t0, Decision: binding.DecisionRefused, Reason: "PCR_MISMATCH"}},
		{Node: "silent", Identity: "z", Renewed: t0.Add(-time.Hour)},
		{Node: "unregistered", Identity: "w", Renewed: t0.Add(-time.Hour)},
	}
	m := &counts{}
	ctl, err := New(Config{Client: c, Statuses: sts, Identity: "test", Effect: EffectNoExecute, Metrics: m, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if err := ctl.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if tt := taintOf(t, c, "good"); tt != nil {
		t.Fatalf("attested node tainted: %+v", tt)
	}
	if tt := taintOf(t, c, "bad"); tt == nil || tt.Value != "refused" || tt.Effect != corev1.TaintEffectNoExecute {
		t.Fatalf("refused node: taint %+v", tt)
	}
	if tt := taintOf(t, c, "silent"); tt == nil || tt.Value != "stale" {
		t.Fatalf("silent node: taint %+v", tt)
	}
	if *m != (counts{1, 2, 1, 0}) {
		t.Fatalf("metrics %+v, want 1 attested, 2 stale, 1 refused", *m)
	}
	// "bad" attests again: its taint goes, the other taint stays.
	sts[1].Last = &binding.Attestation{Time: t0.Add(time.Minute), Decision: binding.DecisionAttested, Reason: "NONE"}
	sts[1].Renewed = t0.Add(time.Minute)
	ctl.cfg.Statuses = sts
	if err := ctl.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	n, _ := c.CoreV1().Nodes().Get(context.Background(), "bad", metav1.GetOptions{})
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != other.Key {
		t.Fatalf("taints after passing again: %+v, want only %s", n.Spec.Taints, other.Key)
	}
}

func TestReportOnlyTaintsNothing(t *testing.T) {
	c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "silent"}})
	m := &counts{}
	ctl, _ := New(Config{Client: c, Statuses: statuses{{Node: "silent", Identity: "z"}}, Identity: "t", Effect: EffectNone, Metrics: m})
	if err := ctl.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if tt := taintOf(t, c, "silent"); tt != nil || *m != (counts{0, 1, 0, 0}) {
		t.Fatalf("report-only: taint %+v metrics %+v", tt, *m)
	}
}

func TestConfigRefusesUnknownEffect(t *testing.T) {
	_, err := New(Config{Client: fake.NewClientset(), Statuses: statuses{}, Identity: "t", Effect: "PreferNoSchedule"})
	if err == nil || err.Error() != `reattest: effect "PreferNoSchedule" is not NoSchedule, NoExecute or none` {
		t.Fatalf("err = %v", err)
	}
}
