package reattest

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/latchkey/latchkey/internal/kubekey"
	"github.com/latchkey/latchkey/verifier/binding"
)

// cordoned is a Node the agent cordoned after an offline unlock at at.
func cordoned(name string, at time.Time) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1", Annotations: map[string]string{
		kubekey.AnnotationCordoned: "offline", kubekey.AnnotationCordonedAt: at.UTC().Format(time.RFC3339)}},
		Spec: corev1.NodeSpec{Unschedulable: true}}
}

func getNode(t *testing.T, c *fake.Clientset, name string) *corev1.Node {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func attestedAt(at time.Time) binding.NodeStatus {
	return binding.NodeStatus{Node: "w-1", Identity: "x", Renewed: at, Last: &binding.Attestation{Time: at, Decision: binding.DecisionAttested, Reason: "NONE"}}
}

// A node that cordoned itself while no verifier ran is offline until a
// re-attestation after the cordon: tainted, cordon kept, even though its
// Lease still shows an earlier attestation within the deadline (the
// verifier never heard of the offline boot). The re-attestation after it
// lifts the taint and the cordon, annotation included, in one patch.
func TestAgentCordonLiftedOnlyAfterReattestation(t *testing.T) {
	cordonAt := t0.Add(time.Minute)
	c := fake.NewClientset(cordoned("w-1", cordonAt))
	sts := statuses{attestedAt(t0)}
	now := cordonAt.Add(time.Second)
	ctl, err := New(Config{Client: c, Statuses: sts, Identity: "t", Metrics: &counts{}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if err := ctl.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	n := getNode(t, c, "w-1")
	if tt := taintOf(t, c, "w-1"); tt == nil || tt.Value != "offline" || tt.Effect != corev1.TaintEffectNoSchedule || !n.Spec.Unschedulable ||
		n.Annotations[kubekey.AnnotationCordoned] != "offline" {
		t.Fatalf("before the re-attestation: taint %+v, unschedulable %v, annotations %v", tt, n.Spec.Unschedulable, n.Annotations)
	}
	patches := 0
	c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) { patches++; return false, nil, nil })
	ctl.cfg.Statuses = statuses{attestedAt(cordonAt.Add(30 * time.Second))}
	if err := ctl.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	n = getNode(t, c, "w-1")
	if tt := taintOf(t, c, "w-1"); tt != nil || n.Spec.Unschedulable || n.Annotations[kubekey.AnnotationCordoned] != "" ||
		n.Annotations[kubekey.AnnotationCordonedAt] != "" || patches != 1 {
		t.Fatalf("after the re-attestation: taint %+v, unschedulable %v, annotations %v, %d patches", tt, n.Spec.Unschedulable, n.Annotations, patches)
	}
}

// An operator's cordon is never lifted: not without the annotation, not
// with an annotation value that is not latchkey's.
func TestOperatorCordonLeftAlone(t *testing.T) {
	op := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "w-1"}, Spec: corev1.NodeSpec{Unschedulable: true}}
	other := cordoned("w-2", t0)
	other.Annotations[kubekey.AnnotationCordoned] = "maintenance"
	c := fake.NewClientset(op, other)
	st2 := attestedAt(t0.Add(time.Hour))
	st2.Node = "w-2"
	ctl, _ := New(Config{Client: c, Statuses: statuses{attestedAt(t0.Add(time.Hour)), st2}, Identity: "t", Now: func() time.Time { return t0.Add(time.Hour) }})
	if err := ctl.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"w-1", "w-2"} {
		if n := getNode(t, c, name); !n.Spec.Unschedulable || taintOf(t, c, name) != nil {
			t.Fatalf("%s: operator's cordon lifted or node tainted: %+v", name, n.Spec)
		}
	}
}

// In report-only mode the verifier taints nothing but still lifts the
// agent's cordon once the node is attested: the cordon is not its own
// to keep.
func TestReportOnlyStillLiftsAgentCordon(t *testing.T) {
	c := fake.NewClientset(cordoned("w-1", t0))
	ctl, _ := New(Config{Client: c, Statuses: statuses{attestedAt(t0.Add(time.Minute))}, Identity: "t",
		Effect: EffectNone, OfflineEffect: EffectNone, Now: func() time.Time { return t0.Add(time.Minute) }})
	if err := ctl.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := getNode(t, c, "w-1"); n.Spec.Unschedulable || n.Annotations[kubekey.AnnotationCordoned] != "" {
		t.Fatalf("cordon kept: %+v %v", n.Spec, n.Annotations)
	}
}

// A conflict re-reads the Node and decides again: an operator who
// removed latchkey's annotation meanwhile (taking the cordon over) keeps
// the cordon.
func TestUncordonConflictRereads(t *testing.T) {
	c := fake.NewClientset(cordoned("w-1", t0))
	conflicts := 0
	c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts > 0 {
			return false, nil, nil
		}
		conflicts++
		// The tracker, not the clientset: the fake holds its lock while
		// a reactor runs.
		gvr := schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
		o, err := c.Tracker().Get(gvr, "", "w-1")
		if err != nil {
			t.Fatal(err)
		}
		n := o.(*corev1.Node).DeepCopy()
		delete(n.Annotations, kubekey.AnnotationCordoned)
		if err := c.Tracker().Update(gvr, n, ""); err != nil {
			t.Fatal(err)
		}
		return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, "w-1", nil)
	})
	ctl, _ := New(Config{Client: c, Statuses: statuses{attestedAt(t0.Add(time.Minute))}, Identity: "t", Now: func() time.Time { return t0.Add(time.Minute) }})
	if err := ctl.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := getNode(t, c, "w-1"); !n.Spec.Unschedulable || conflicts != 1 {
		t.Fatalf("after the conflict: unschedulable %v, conflicts %d", n.Spec.Unschedulable, conflicts)
	}
	// Without the operator's change, the retry lifts it.
	c2 := fake.NewClientset(cordoned("w-1", t0))
	n2 := 0
	c2.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		n2++
		if n2 == 1 {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, "w-1", nil)
		}
		return false, nil, nil
	})
	ctl.cfg.Client = c2
	if err := ctl.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := getNode(t, c2, "w-1"); n.Spec.Unschedulable || n2 != 2 {
		t.Fatalf("after a retried conflict: unschedulable %v, patches %d", n.Spec.Unschedulable, n2)
	}
}

// offlineSince takes the later of the Lease's offline boot and the
// agent's cordon; an unreadable cordon time adds nothing.
func TestOfflineSince(t *testing.T) {
	lease := t0.Add(time.Hour)
	st := binding.NodeStatus{BootedOffline: lease}
	if got := offlineSince(st, cordoned("n", t0.Add(2*time.Hour))); !got.Equal(t0.Add(2 * time.Hour)) {
		t.Fatalf("later cordon: %v", got)
	}
	if got := offlineSince(st, cordoned("n", t0)); !got.Equal(lease) {
		t.Fatalf("earlier cordon: %v", got)
	}
	bad := cordoned("n", t0.Add(2*time.Hour))
	bad.Annotations[kubekey.AnnotationCordonedAt] = "soon"
	if got := offlineSince(st, bad); !got.Equal(lease) {
		t.Fatalf("unreadable cordon time: %v", got)
	}
	// The time alone, without latchkey's annotation, is not a cordon.
	delete(bad.Annotations, kubekey.AnnotationCordoned)
	bad.Annotations[kubekey.AnnotationCordonedAt] = t0.Add(2 * time.Hour).Format(time.RFC3339)
	if got := offlineSince(st, bad); !got.Equal(lease) {
		t.Fatalf("time without the annotation: %v", got)
	}
}

// A conflict whose re-read finds the agent's cordon renewed after the
// re-attestation (a later offline boot) decides again: the node is
// offline, the cordon stays, the taint goes on.
func TestUncordonConflictFindsRenewedCordon(t *testing.T) {
	c := fake.NewClientset(cordoned("w-1", t0))
	conflicts := 0
	c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts > 0 {
			return false, nil, nil
		}
		conflicts++
		gvr := schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
		if err := c.Tracker().Update(gvr, cordoned("w-1", t0.Add(2*time.Minute)), ""); err != nil {
			t.Fatal(err)
		}
		return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, "w-1", nil)
	})
	now := t0.Add(3 * time.Minute)
	ctl, _ := New(Config{Client: c, Statuses: statuses{attestedAt(t0.Add(time.Minute))}, Identity: "t", Now: func() time.Time { return now }})
	if err := ctl.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	n := getNode(t, c, "w-1")
	if tt := taintOf(t, c, "w-1"); tt == nil || tt.Value != "offline" || !n.Spec.Unschedulable || n.Annotations[kubekey.AnnotationCordoned] != "offline" {
		t.Fatalf("after the conflict: taint %+v, unschedulable %v, annotations %v", tt, n.Spec.Unschedulable, n.Annotations)
	}
}
