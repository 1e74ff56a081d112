package app

import (
	"fmt"

	"k8s.io/client-go/kubernetes"

	"github.com/latchkey/latchkey/internal/logkey"
	"github.com/latchkey/latchkey/verifier/policy"
)

// loadPolicyNext loads the candidate policy (policyNext), which must
// compile like the enforced one: a candidate that does not load is an
// error at start, so an operator never reads shadow decisions of a policy
// that was not in force as a candidate.
func (v *Verifier) loadPolicyNext() error {
	if v.cfg.PolicyNext == "" {
		return nil
	}
	var err error
	v.next, err = policy.NewStore(policy.StoreConfig{Path: v.cfg.PolicyNext, Deps: v.policyDeps, Logger: v.deps.Logger})
	if err != nil {
		return fmt.Errorf("policyNext: %w", err)
	}
	v.deps.Logger.Info("candidate policy loaded (shadow, not enforced)", logkey.Path, v.cfg.PolicyNext, logkey.Policy, v.next.Current().Digest)
	return nil
}

// policyNext is the candidate as a policy.Source, nil (not a typed nil)
// without one.
func (v *Verifier) policyNext() policy.Source {
	if v.next == nil {
		return nil
	}
	return v.next
}

// KubeClient is the verifier's Kubernetes client for cfg (the
// kubeconfig, or the systemd credential), for commands that read what the
// running verifiers recorded (policy diff).
func KubeClient(cfg *Config) (kubernetes.Interface, error) {
	if cfg.Kubernetes == nil {
		return nil, fmt.Errorf("no kubernetes section: node records exist only in Kubernetes mode")
	}
	return kubeClient(cfg.Kubernetes)
}
