// Package deploy ships the RBAC latchkey needs in a kubeadm cluster: the
// verifier's own narrow credential (verifier-rbac.yaml) and what latchkey
// bootstrap tokens may do (bootstrap-rbac.yaml: kubeadm join's needs
// without kubeadm's CSR auto-approval), and the latchkey-system namespace
// holding the binding Leases. The manifests are the source of
// truth; Apply installs them with client-go, so no kubectl is needed.
//
// Beside them lies the monitoring pack (docs/metrics.md), which is not
// applied to the cluster: prometheus-rules.yaml (recording rules and
// alerts, unit-tested by promtool with prometheus-rules.test.yaml) and
// grafana-dashboard.json.
package deploy

import (
	"bufio"
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
)

// Manifests holds the shipped YAML files.
//
//go:embed verifier-rbac.yaml bootstrap-rbac.yaml
var Manifests embed.FS

// Files are the manifests in the order Apply installs them.
var Files = []string{"bootstrap-rbac.yaml", "verifier-rbac.yaml"}

// Objects decodes every object of the shipped manifests.
func Objects() ([]runtime.Object, error) {
	var objs []runtime.Object
	for _, f := range Files {
		raw, err := Manifests.ReadFile(f)
		if err != nil {
			return nil, err
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			objs = append(objs, obj)
		}
	}
	return objs, nil
}

// Apply creates the shipped objects, or updates those that exist.
func Apply(ctx context.Context, c kubernetes.Interface) error {
	objs, err := Objects()
	if err != nil {
		return err
	}
	for _, o := range objs {
		if err := apply(ctx, c, o); err != nil {
			return err
		}
	}
	return nil
}

func apply(ctx context.Context, c kubernetes.Interface, o runtime.Object) error {
	rbac := c.RbacV1()
	var err error
	switch v := o.(type) {
	case *corev1.Namespace:
		_, err = c.CoreV1().Namespaces().Create(ctx, v, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = nil
		}
	case *rbacv1.ClusterRole:
		err = upsert(ctx, v, rbac.ClusterRoles().Create, rbac.ClusterRoles().Update)
	case *rbacv1.ClusterRoleBinding:
		err = upsert(ctx, v, rbac.ClusterRoleBindings().Create, rbac.ClusterRoleBindings().Update)
	case *rbacv1.Role:
		err = upsert(ctx, v, rbac.Roles(v.Namespace).Create, rbac.Roles(v.Namespace).Update)
	case *rbacv1.RoleBinding:
		err = upsert(ctx, v, rbac.RoleBindings(v.Namespace).Create, rbac.RoleBindings(v.Namespace).Update)
	default:
		return fmt.Errorf("deploy: unexpected object %T", o)
	}
	return err
}

// upsert creates obj, or updates it when it exists. (A changed roleRef of
// a binding cannot be updated; delete the binding first.)
func upsert[T metav1.Object](ctx context.Context, obj T,
	create func(context.Context, T, metav1.CreateOptions) (T, error),
	update func(context.Context, T, metav1.UpdateOptions) (T, error)) error {
	_, err := create(ctx, obj, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = update(ctx, obj, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("deploy: %s: %w", obj.GetName(), err)
	}
	return nil
}
