package token

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	certutil "k8s.io/client-go/util/cert"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	"k8s.io/cluster-bootstrap/token/jws"
	"k8s.io/kubernetes/cmd/kubeadm/app/util/pubkeypin"
)

// maxClusterInfo bounds the cluster-info kubeconfig latchkey parses.
const maxClusterInfo = 1 << 20

// signed reports whether cm carries a valid JWS signature of its
// kubeconfig made with this token.
func signed(cm *corev1.ConfigMap, id, secret string) bool {
	sig, ok := cm.Data[bootstrapapi.JWSSignatureKeyPrefix+id]
	if !ok {
		return false
	}
	return jws.DetachedTokenIsValid(sig, cm.Data[bootstrapapi.KubeConfigKey], id, secret)
}

// waitSigned returns cluster-info once the bootstrap signer has signed it
// with this token, so that `kubeadm join` discovery with the token cannot
// race the signer. It watches the one ConfigMap and re-watches when the
// watch ends early; ctx bounds the wait.
func waitSigned(ctx context.Context, c kubernetes.Interface, id, secret string) (*corev1.ConfigMap, error) {
	cms := c.CoreV1().ConfigMaps(metav1.NamespacePublic)
	for {
		cm, err := cms.Get(ctx, bootstrapapi.ConfigMapClusterInfo, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("read cluster-info: %w", err)
		}
		if signed(cm, id, secret) {
			return cm, nil
		}
		cm, err = watchSigned(ctx, c, cm.ResourceVersion, id, secret)
		if cm != nil || err != nil {
			return cm, err
		}
	}
}

// watchSigned watches cluster-info from resourceVersion and returns it
// once signed, or nil, nil when the watch ended without it.
func watchSigned(ctx context.Context, c kubernetes.Interface, rv, id, secret string) (*corev1.ConfigMap, error) {
	w, err := c.CoreV1().ConfigMaps(metav1.NamespacePublic).Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", bootstrapapi.ConfigMapClusterInfo).String(),
		ResourceVersion: rv,
	})
	if err != nil {
		return nil, fmt.Errorf("watch cluster-info: %w", err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, nil
			}
			cm, isCM := ev.Object.(*corev1.ConfigMap)
			if ev.Type == watch.Error || !isCM {
				return nil, nil
			}
			if cm.Name == bootstrapapi.ConfigMapClusterInfo && signed(cm, id, secret) {
				return cm, nil
			}
		}
	}
}

// clusterInfo is what a joiner learns from the cluster-info kubeconfig.
type clusterInfo struct {
	endpoints []string
	caHashes  []string
	bundle    []byte // PEM, as published
}

// parseClusterInfo reads the API server endpoint and the SPKI pins of
// every certificate in the published trust bundle (two CAs during a CA
// rotation: both are returned, in bundle order).
func parseClusterInfo(cm *corev1.ConfigMap) (clusterInfo, error) {
	raw := cm.Data[bootstrapapi.KubeConfigKey]
	if raw == "" || len(raw) > maxClusterInfo {
		return clusterInfo{}, errors.New("cluster-info has no usable kubeconfig")
	}
	kc, err := clientcmd.Load([]byte(raw))
	if err != nil {
		return clusterInfo{}, fmt.Errorf("parse cluster-info kubeconfig: %w", err)
	}
	if len(kc.Clusters) != 1 {
		return clusterInfo{}, fmt.Errorf("cluster-info names %d clusters, want 1", len(kc.Clusters))
	}
	var info clusterInfo
	for _, cl := range kc.Clusters {
		ep, err := hostPort(cl.Server)
		if err != nil {
			return clusterInfo{}, err
		}
		info.endpoints = []string{ep}
		if info.caHashes, err = bundlePins(cl.CertificateAuthorityData); err != nil {
			return clusterInfo{}, err
		}
		info.bundle = cl.CertificateAuthorityData
	}
	return info, nil
}

// hostPort turns "https://host:port" into "host:port".
func hostPort(server string) (string, error) {
	u, err := url.Parse(server)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return "", fmt.Errorf("cluster-info server %q is not an https URL", server)
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		return net.JoinHostPort(u.Hostname(), "443"), nil
	}
	return u.Host, nil
}

// bundlePins returns the "sha256:<hex>" SPKI pin of each certificate in
// a PEM bundle, without duplicates.
func bundlePins(pemData []byte) ([]string, error) {
	certs, err := certutil.ParseCertsPEM(pemData)
	if err != nil {
		return nil, fmt.Errorf("parse cluster CA bundle: %w", err)
	}
	seen := map[string]bool{}
	var pins []string
	for _, c := range certs {
		p := pubkeypin.Hash(c)
		if !seen[p] {
			seen[p] = true
			pins = append(pins, p)
		}
	}
	return pins, nil
}

// pinnedBundle returns, as PEM, the certificates of bundle whose SPKI pin
// is one of pins: the agent accepts a bundle only if every certificate in
// it is pinned, so a configured pin list narrows what the ticket carries.
func pinnedBundle(bundle []byte, pins []string) ([]byte, error) {
	certs, err := certutil.ParseCertsPEM(bundle)
	if err != nil {
		return nil, fmt.Errorf("parse cluster CA bundle: %w", err)
	}
	var out []byte
	for _, c := range certs {
		if slices.Contains(pins, pubkeypin.Hash(c)) {
			out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no certificate of cluster-info's CA bundle matches the configured CA cert hashes")
	}
	return out, nil
}
