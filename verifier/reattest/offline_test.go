package reattest

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/latchkey/latchkey/verifier/binding"
)

func TestDecideOffline(t *testing.T) {
	booted := t0.Add(time.Minute)
	attested := func(at time.Time) *binding.Attestation {
		return &binding.Attestation{Time: at, Decision: binding.DecisionAttested, Reason: "NONE"}
	}
	cases := []struct {
		name   string
		st     binding.NodeStatus
		want   State
		reason string
	}{
		{"booted offline, never re-attested", binding.NodeStatus{Renewed: t0, BootedOffline: booted}, Offline, "BOOTED_OFFLINE"},
		{"re-attested before the offline boot", binding.NodeStatus{Renewed: t0, Last: attested(t0), BootedOffline: booted}, Offline, "BOOTED_OFFLINE"},
		// A join after the offline boot renews the Lease but proves
		// nothing about the offline boot: the taint stays.
		{"joined after it", binding.NodeStatus{Renewed: booted.Add(time.Minute), Last: attested(t0), BootedOffline: booted}, Offline, "BOOTED_OFFLINE"},
		{"re-attested after it", binding.NodeStatus{Renewed: booted.Add(time.Second), Last: attested(booted.Add(time.Second)), BootedOffline: booted}, Attested, "NONE"},
		// A refusal names its own reason, offline or not.
		{"refused after it", binding.NodeStatus{Renewed: booted.Add(time.Second), BootedOffline: booted,
			Last: &binding.Attestation{Time: booted.Add(time.Second), Decision: binding.DecisionRefused, Reason: "PCR_MISMATCH"}}, Refused, "PCR_MISMATCH"},
	}
	for _, c := range cases {
		if got, reason := Decide(c.st, booted.Add(2*time.Minute), DefaultDeadline); got != c.want || reason != c.reason {
			t.Errorf("%s: %s %s, want %s %s", c.name, got, reason, c.want, c.reason)
		}
	}
}

// The offline taint is set with its own effect (default NoSchedule, here
// next to a NoExecute effect for the others) and cleared by the
// re-attestation that follows the offline boot.
func TestPassTaintsOfflineUntilReattested(t *testing.T) {
	c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-1"}})
	booted := t0.Add(time.Minute)
	sts := statuses{{Node: "cp-1", Identity: "x", Renewed: t0, BootedOffline: booted}}
	m := &counts{}
	now := booted.Add(time.Second)
	ctl, err := New(Config{Client: c, Statuses: sts, Identity: "t", Effect: EffectNoExecute, Metrics: m, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if err := ctl.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if tt := taintOf(t, c, "cp-1"); tt == nil || tt.Value != "offline" || tt.Effect != corev1.TaintEffectNoSchedule {
		t.Fatalf("offline node: taint %+v", tt)
	}
	if *m != (counts{0, 0, 0, 1}) {
		t.Fatalf("metrics %+v, want 1 offline", *m)
	}
	sts[0].Last = &binding.Attestation{Time: booted.Add(time.Minute), Decision: binding.DecisionAttested, Reason: "NONE"}
	sts[0].Renewed = sts[0].Last.Time
	ctl.cfg.Statuses = sts
	if err := ctl.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if tt := taintOf(t, c, "cp-1"); tt != nil {
		t.Fatalf("re-attested node still tainted: %+v", tt)
	}
	if *m != (counts{1, 0, 0, 0}) {
		t.Fatalf("metrics %+v, want 1 attested", *m)
	}
}

// offlineEffect "none" reports offline nodes without tainting them, and
// the other states keep their taint.
func TestOfflineReportOnly(t *testing.T) {
	c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-1"}})
	ctl, err := New(Config{Client: c, Statuses: statuses{{Node: "cp-1", Identity: "x", Renewed: t0, BootedOffline: t0}},
		Identity: "t", OfflineEffect: EffectNone, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	if err := ctl.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if tt := taintOf(t, c, "cp-1"); tt != nil {
		t.Fatalf("report-only offline: taint %+v", tt)
	}
	if _, err := New(Config{Client: c, Statuses: statuses{}, Identity: "t", OfflineEffect: "PreferNoSchedule"}); err == nil ||
		err.Error() != `reattest: effect "PreferNoSchedule" is not NoSchedule, NoExecute or none` {
		t.Fatalf("err = %v", err)
	}
}
