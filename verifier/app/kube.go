package app

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/latchkey/latchkey/verifier/token"
)

// KubeconfigCredential is the systemd credential holding the verifier's
// narrow Kubernetes credential when no kubeconfig path is configured.
const KubeconfigCredential = "latchkey-kubeconfig"

// newKubeMinter builds the client-go token step from the Kubernetes section.
func newKubeMinter(k *Kubernetes, log *slog.Logger) (kubernetes.Interface, token.Minter, error) {
	client, err := kubeClient(k.Kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	m, err := token.NewKube(token.KubeConfig{Client: client, Logger: log, TTL: k.TokenTTL.Duration,
		SignatureWait: k.JWSWait.Duration, Endpoints: k.APIServerEndpoints, CACertHashes: k.CACertHashes})
	return client, m, err
}

// kubeClient reads the kubeconfig at path, or the systemd credential.
func kubeClient(path string) (kubernetes.Interface, error) {
	if path == "" {
		dir := os.Getenv("CREDENTIALS_DIRECTORY")
		if dir == "" {
			return nil, errors.New("kubernetes: no kubeconfig configured and $CREDENTIALS_DIRECTORY is not set")
		}
		path = filepath.Join(dir, KubeconfigCredential)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: kubeconfig %s: %w", path, err)
	}
	rc.UserAgent = "latchkey-verifier"
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	return c, nil
}
