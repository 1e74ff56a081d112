// Package reattest is the verifier's taint controller for continuous
// re-attestation. Every re-attestation's decision is on the node's binding
// Lease (verifier/binding: spec.renewTime and latchkey.io/ annotations);
// this controller reads those Leases and keeps the taint
// latchkey.io/unattested on every Node that is not currently attested:
//
//   - refused: the latest re-attestation was refused by the policy;
//   - offline: the node reported that it unlocked its disk offline
//     (docs/offline-unlock.md) and no re-attestation has succeeded since;
//   - stale: the Lease was last renewed (a re-attestation, or the join
//     that minted the node's token) longer than Deadline ago: the node went
//     silent, or its re-attestations never reached a verifier;
//   - attested: otherwise; the taint is removed.
//
// A Node its agent cordoned after an offline unlock while no verifier ran
// (annotation latchkey.io/cordoned, agent/cordon) counts as booted
// offline from its cordon time; the pass that finds it attested after
// that lifts the cordon with the taint. A cordon without that annotation
// is an operator's and is never lifted.
//
// A Node without a bound node Lease (not joined through latchkey) is left
// alone. One replica acts at a time: the controller runs only while it
// holds a coordination.k8s.io Lease in latchkey-system through client-go's
// leaderelection, so two verifiers never fight over a taint. A verifier
// outage taints nothing by itself: only the deadline does, and the
// deadline (default 30m) is three agent intervals.
package reattest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/latchkey/latchkey/internal/kubekey"
	"github.com/latchkey/latchkey/internal/logkey"
	"github.com/latchkey/latchkey/verifier/binding"
)

// Effects Config.Effect accepts.
const (
	EffectNoSchedule = "NoSchedule"
	EffectNoExecute  = "NoExecute"
	// EffectNone is report-only: metrics and log lines, no taint.
	EffectNone = "none"
)

// Defaults.
const (
	DefaultDeadline  = 30 * time.Minute
	DefaultResync    = 30 * time.Second
	DefaultLeaseName = "latchkey-reattest-controller"
)

// State of one node.
type State string

// States.
const (
	Attested State = "attested"
	Refused  State = "refused"
	Offline  State = "offline"
	Stale    State = "stale"
)

// Statuses reads node records (binding.Leases).
type Statuses interface {
	NodeStatuses(ctx context.Context) ([]binding.NodeStatus, error)
}

// Metrics is told the count of nodes in each state after each pass.
type Metrics interface {
	ReattestNodes(attested, stale, refused, offline int)
}

// Config configures a Controller.
type Config struct {
	Client   kubernetes.Interface
	Statuses Statuses
	// Namespace holds the election Lease (binding.DefaultNamespace).
	Namespace string
	// Identity names this replica in the election (required; the host
	// name and pid make a good one).
	Identity string
	// LeaseName of the election (DefaultLeaseName).
	LeaseName string
	// Deadline after which a node whose Lease was not renewed is stale
	// (DefaultDeadline).
	Deadline time.Duration
	// Effect of the taint (EffectNoSchedule when empty).
	Effect string
	// OfflineEffect is the effect of the offline taint
	// (EffectNoSchedule when empty).
	OfflineEffect string
	// Resync is how often the leader checks every node (DefaultResync).
	Resync time.Duration
	// LeaseDuration, RenewDeadline and RetryPeriod of the election
	// (15s, 10s, 2s when zero).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Metrics                                   Metrics
	Logger                                    *slog.Logger
	Now                                       func() time.Time
}

// Controller taints unattested nodes.
type Controller struct{ cfg Config }

// New checks cfg and fills defaults.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Statuses == nil || cfg.Identity == "" {
		return nil, errors.New("reattest: client, statuses and identity are required")
	}
	for _, e := range []*string{&cfg.Effect, &cfg.OfflineEffect} {
		switch *e {
		case "":
			*e = EffectNoSchedule
		case EffectNoSchedule, EffectNoExecute, EffectNone:
		default:
			return nil, fmt.Errorf("reattest: effect %q is not NoSchedule, NoExecute or none", *e)
		}
	}
	if cfg.Deadline < 0 || cfg.Resync < 0 {
		return nil, errors.New("reattest: negative deadline or resync")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.Deadline, DefaultDeadline)
	def(&cfg.Resync, DefaultResync)
	def(&cfg.LeaseDuration, 15*time.Second)
	def(&cfg.RenewDeadline, 10*time.Second)
	def(&cfg.RetryPeriod, 2*time.Second)
	if cfg.Namespace == "" {
		cfg.Namespace = binding.DefaultNamespace
	}
	if cfg.LeaseName == "" {
		cfg.LeaseName = DefaultLeaseName
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Logger = cfg.Logger.With(logkey.Component, "reattest")
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Controller{cfg: cfg}, nil
}

// Run takes part in the election until ctx ends, and while leading runs
// a pass every Resync. Losing the lead stops the passes; the election is
// then joined again.
func (c *Controller) Run(ctx context.Context) {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: c.cfg.Namespace, Name: c.cfg.LeaseName},
		Client:     c.cfg.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: c.cfg.Identity},
	}
	for ctx.Err() == nil {
		leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   c.cfg.LeaseDuration,
			RenewDeadline:   c.cfg.RenewDeadline,
			RetryPeriod:     c.cfg.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            c.cfg.LeaseName,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: c.lead,
				OnStoppedLeading: func() {
					c.cfg.Logger.Info("re-attestation controller stopped leading", logkey.Identity, c.cfg.Identity)
				},
			},
		})
	}
}

// lead runs passes until the lead is lost (ctx ends).
func (c *Controller) lead(ctx context.Context) {
	c.cfg.Logger.Info("re-attestation controller leading", logkey.Identity, c.cfg.Identity,
		logkey.Deadline, c.cfg.Deadline.String(), logkey.Effect, c.cfg.Effect)
	t := time.NewTicker(c.cfg.Resync)
	defer t.Stop()
	for {
		if err := c.Pass(ctx); err != nil && ctx.Err() == nil {
			c.cfg.Logger.Warn("re-attestation pass incomplete", logkey.Error, err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Decide is the state of a node at now.
func Decide(st binding.NodeStatus, now time.Time, deadline time.Duration) (State, string) {
	if st.Last != nil && st.Last.Decision == binding.DecisionRefused && !st.Last.Time.Before(st.Renewed) {
		return Refused, st.Last.Reason
	}
	if offlineSinceAttested(st) {
		return Offline, "BOOTED_OFFLINE"
	}
	if st.Renewed.IsZero() || now.Sub(st.Renewed) > deadline {
		return Stale, "DEADLINE_EXCEEDED"
	}
	return Attested, "NONE"
}

// offlineSinceAttested: the node reported an offline unlock and no
// re-attestation after it was accepted (a join does not clear it: only a
// re-attestation proves what the node runs after that boot).
func offlineSinceAttested(st binding.NodeStatus) bool {
	if st.BootedOffline.IsZero() {
		return false
	}
	return st.Last == nil || st.Last.Decision != binding.DecisionAttested || st.Last.Time.Before(st.BootedOffline)
}

// effect is the taint effect for a node in state.
func (c *Controller) effect(state State) string {
	if state == Offline {
		return c.cfg.OfflineEffect
	}
	return c.cfg.Effect
}

// Pass checks every node once: reads every node record, decides, and
// adds or removes the taint where the Node disagrees.
func (c *Controller) Pass(ctx context.Context) error {
	sts, listErr := c.cfg.Statuses.NodeStatuses(ctx)
	if sts == nil && listErr != nil {
		return listErr
	}
	// One list per pass, served from the API server's watch cache
	// (resourceVersion 0), instead of a read per node.
	nl, err := c.cfg.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		return errors.Join(fmt.Errorf("list nodes: %w", err), listErr)
	}
	nodes := make(map[string]*corev1.Node, len(nl.Items))
	for i := range nl.Items {
		nodes[nl.Items[i].Name] = &nl.Items[i]
	}
	now := c.cfg.Now()
	var counts [4]int
	var errs []error
	for _, st := range sts {
		n := nodes[st.Node]
		state, reason := c.decide(st, n, now)
		switch state {
		case Attested:
			counts[0]++
		case Stale:
			counts[1]++
		case Refused:
			counts[2]++
		case Offline:
			counts[3]++
		}
		if n == nil {
			continue // joined through latchkey but not (or no longer) registered
		}
		if state != Attested && c.effect(state) == EffectNone {
			c.cfg.Logger.Warn("node unattested (report-only)", logkey.Node, st.Node, logkey.State, string(state), logkey.Reason, reason)
			continue
		}
		if state == Attested && c.cfg.Effect == EffectNone && c.cfg.OfflineEffect == EffectNone && !agentCordoned(n) {
			continue // report-only throughout: this controller never taints
		}
		if err := c.reconcile(ctx, n, st, now, state, reason); err != nil {
			errs = append(errs, err)
		}
	}
	if c.cfg.Metrics != nil {
		c.cfg.Metrics.ReattestNodes(counts[0], counts[1], counts[2], counts[3])
	}
	return errors.Join(append(errs, listErr)...)
}

// offlineSince is when the node last booted offline as far as the
// verifier can tell: the Lease's record of it, or the agent's cordon of
// the Node (latchkey.io/cordoned-at, the API server's clock) when that is
// later. A node that unlocked offline while no verifier ran cordons
// itself; until a re-attestation after that cordon is accepted, the
// controller treats it as booted offline and taints it as such. A cordon
// annotation without a readable time adds nothing: the Lease decides.
func offlineSince(st binding.NodeStatus, n *corev1.Node) time.Time {
	if !agentCordoned(n) {
		return st.BootedOffline
	}
	at, err := time.Parse(time.RFC3339, n.Annotations[kubekey.AnnotationCordonedAt])
	if err != nil || !at.After(st.BootedOffline) {
		return st.BootedOffline
	}
	return at
}

// agentCordoned: the Node carries the cordon latchkey's agent sets after
// an offline unlock (agent/cordon), the only cordon the controller lifts.
func agentCordoned(n *corev1.Node) bool {
	return n != nil && n.Annotations[kubekey.AnnotationCordoned] == cordonedOffline
}

// cordonedOffline is AnnotationCordoned's value (agent/cordon.ValueOffline).
const cordonedOffline = "offline"

// conflictRetries bounds how often reconcile re-reads a Node that changed
// between its read and the patch.
const conflictRetries = 3

// reconcile makes one Node's taint match its state, and lifts the agent's
// offline cordon of an attested node, in one merge patch conditioned on
// the Node's resourceVersion: a concurrent change (kubelet's node
// controller, an operator's cordon or taint) is re-read and decided
// again, never overwritten. A list that lagged behind conflicts the same
// way.
//
// The Node read again is decided again too: a cordon the agent renewed
// meanwhile (a later offline boot) moves the node back to offline.
func (c *Controller) reconcile(ctx context.Context, n *corev1.Node, st binding.NodeStatus, now time.Time, state State, reason string) error {
	for try := 1; ; try++ {
		err := c.reconcileOnce(ctx, n, state, reason)
		if !apierrors.IsConflict(err) {
			return err
		}
		if try == conflictRetries {
			return nil // still changing; the next pass decides again
		}
		name := n.Name
		if n, err = c.cfg.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("read node %s again: %w", name, err)
		}
		state, reason = c.decide(st, n, now)
	}
}

// decide is the state of the node of st whose Node is n (nil: not
// registered) at now: Decide, with the agent's offline cordon counted as
// an offline boot.
func (c *Controller) decide(st binding.NodeStatus, n *corev1.Node, now time.Time) (State, string) {
	st.BootedOffline = offlineSince(st, n)
	return Decide(st, now, c.cfg.Deadline)
}

// reconcileOnce patches n if it disagrees with state; a conflict is
// returned as the API's error.
func (c *Controller) reconcileOnce(ctx context.Context, n *corev1.Node, state State, reason string) error {
	node := n.Name
	taints, changed := c.wantTaints(n, state)
	uncordon := state == Attested && agentCordoned(n)
	if !changed && !uncordon {
		return nil
	}
	spec := map[string]any{}
	meta := map[string]any{"resourceVersion": n.ResourceVersion}
	if changed {
		spec["taints"] = taints
	}
	if uncordon {
		// The cordon and its annotation go together: a node never keeps
		// latchkey's annotation on a cordon latchkey no longer claims.
		spec["unschedulable"] = false
		meta["annotations"] = map[string]any{kubekey.AnnotationCordoned: nil, kubekey.AnnotationCordonedAt: nil}
	}
	patch, err := json.Marshal(map[string]any{"metadata": meta, "spec": spec})
	if err != nil {
		return err
	}
	if _, err := c.cfg.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		if apierrors.IsConflict(err) {
			return err
		}
		return fmt.Errorf("patch node %s: %w", node, err)
	}
	switch {
	case uncordon:
		c.cfg.Logger.Info("node attested after its offline boot; latchkey's cordon lifted", logkey.Node, node)
	case state != Attested:
		c.cfg.Logger.Warn("node tainted unattested", logkey.Node, node, logkey.State, string(state), logkey.Reason, reason, logkey.Effect, c.effect(state))
	default:
		c.cfg.Logger.Info("node attested again; taint removed", logkey.Node, node)
	}
	return nil
}

// wantTaints is n's taints as state wants them, and whether that differs
// from n's.
func (c *Controller) wantTaints(n *corev1.Node, state State) ([]corev1.Taint, bool) {
	want := state != Attested && c.effect(state) != EffectNone
	var taints []corev1.Taint
	has := false
	for _, t := range n.Spec.Taints {
		if t.Key == kubekey.TaintUnattested {
			has = true
			if want && string(t.Effect) == c.effect(state) && t.Value == string(state) {
				return n.Spec.Taints, false
			}
			continue
		}
		taints = append(taints, t)
	}
	if !want && !has {
		return n.Spec.Taints, false
	}
	if want {
		now := metav1.NewTime(c.cfg.Now())
		taints = append(taints, corev1.Taint{Key: kubekey.TaintUnattested, Value: string(state), Effect: corev1.TaintEffect(c.effect(state)), TimeAdded: &now})
	}
	if taints == nil {
		taints = []corev1.Taint{}
	}
	return taints, true
}
