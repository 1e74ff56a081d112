//go:build tools

// Package containerd pins the containerd commands scripts/containerd/build.sh
// builds, so go.mod and go.sum record every module they need.
package containerd

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
)
