package deploy

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/latchkey/latchkey/verifier/token"
)

func TestApplyIsIdempotent(t *testing.T) {
	c := fake.NewClientset()
	for range 2 {
		if err := Apply(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	crbs, _ := c.RbacV1().ClusterRoleBindings().List(context.Background(), metav1.ListOptions{})
	if len(crbs.Items) != 3 {
		t.Fatalf("%d cluster role bindings, want 3", len(crbs.Items))
	}
}

// The bootstrap groups must never be bound to kubeadm's CSR auto-approval.
func TestNoAutoApproval(t *testing.T) {
	objs, err := Objects()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		b, ok := o.(*rbacv1.ClusterRoleBinding)
		if !ok {
			continue
		}
		if b.RoleRef.Name == "system:certificates.k8s.io:certificatesigningrequests:nodeclient" {
			t.Fatalf("%s binds the CSR auto-approval", b.Name)
		}
	}
}

// The verifier's credential can read no Secret but kubeadm-certs.
func TestVerifierReadsNoSecrets(t *testing.T) {
	objs, err := Objects()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		r, ok := o.(*rbacv1.Role)
		if !ok || r.Name != "latchkey:verifier" {
			continue
		}
		for _, rule := range r.Rules {
			if !slices.Contains(rule.Resources, "secrets") {
				continue
			}
			reads := slices.Contains(rule.Verbs, "get") || slices.Contains(rule.Verbs, "list") || slices.Contains(rule.Verbs, "watch")
			if reads && !slices.Equal(rule.ResourceNames, []string{"kubeadm-certs"}) {
				t.Fatalf("rule %+v reads secrets", rule)
			}
		}
	}
}

func TestGroupsMatchTheMinter(t *testing.T) {
	objs, err := Objects()
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]bool{}
	for _, o := range objs {
		var subs []rbacv1.Subject
		switch b := o.(type) {
		case *rbacv1.ClusterRoleBinding:
			subs = b.Subjects
		case *rbacv1.RoleBinding:
			subs = b.Subjects
		}
		for _, s := range subs {
			if s.Kind == "Group" {
				groups[s.Name] = true
			}
		}
	}
	if len(groups) != 2 || !groups[token.Group] || !groups[token.ControlPlaneGroup] {
		t.Fatalf("groups %v", groups)
	}
}

// Binding Leases: the verifier may read and write Leases in its own
// namespace only, never delete them, and the namespace is shipped.
func TestVerifierLeasesOnlyInItsNamespace(t *testing.T) {
	objs, err := Objects()
	if err != nil {
		t.Fatal(err)
	}
	var ns, rule bool
	for _, o := range objs {
		switch v := o.(type) {
		case *corev1.Namespace:
			ns = ns || v.Name == "latchkey-system"
		case *rbacv1.Role:
			for _, r := range v.Rules {
				if !slices.Contains(r.Resources, "leases") {
					continue
				}
				if v.Namespace != "latchkey-system" || !slices.Equal(r.Verbs, []string{"get", "list", "create", "update"}) ||
					!slices.Equal(r.APIGroups, []string{"coordination.k8s.io"}) {
					t.Fatalf("role %s/%s grants %v on leases", v.Namespace, v.Name, r.Verbs)
				}
				rule = true
			}
		case *rbacv1.ClusterRole:
			for _, r := range v.Rules {
				if slices.Contains(r.Resources, "leases") {
					t.Fatalf("cluster role %s grants leases cluster-wide", v.Name)
				}
			}
		}
	}
	if !ns || !rule {
		t.Fatalf("namespace shipped %v, lease rule %v", ns, rule)
	}
	c := fake.NewClientset()
	if err := Apply(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Namespaces().Get(context.Background(), "latchkey-system", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
}

// The taint controller may patch Nodes and nothing more on them: no
// create, update or delete of any Node, and no other new verb.
func TestVerifierNodesPatchOnly(t *testing.T) {
	objs, err := Objects()
	if err != nil {
		t.Fatal(err)
	}
	var verbs []string
	for _, o := range objs {
		r, ok := o.(*rbacv1.ClusterRole)
		if !ok || r.Name != "latchkey:verifier" {
			continue
		}
		for _, rule := range r.Rules {
			if slices.Contains(rule.Resources, "nodes") {
				verbs = append(verbs, rule.Verbs...)
			}
		}
	}
	slices.Sort(verbs)
	if !slices.Equal(verbs, []string{"get", "list", "patch", "watch"}) {
		t.Fatalf("verifier's node verbs %v, want get list patch watch", verbs)
	}
}
