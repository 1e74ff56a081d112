//go:build tools

// Package k8s pins the Kubernetes commands scripts/k8s/build.sh builds, so
// go.mod and go.sum record every module they need.
package k8s

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
