// Package kubestore keeps SEV-SNP collateral (VCEK certificates) in a
// Kubernetes ConfigMap, so every verifier replica shares what one of them
// fetched. It implements snp.Store and lives apart from package snp so the
// agent, which links snp for its issuer, does not link client-go.
package kubestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/latchkey/latchkey/attest/snp"
)

const (
	// DefaultConfigMapName is the ConfigMap ConfigMapStore uses by default.
	DefaultConfigMapName = "latchkey-snp-collateral"
	// maxConfigMapData keeps the ConfigMap well below the 1 MiB object
	// limit (about 600 VCEKs).
	maxConfigMapData  = 900 << 10
	defaultMinRefresh = 30 * time.Second
)

// Config configures New.
type Config struct {
	// Client is the Kubernetes client (a fake clientset in tests).
	Client kubernetes.Interface
	// Namespace holds the ConfigMap; required.
	Namespace string
	// Name is the ConfigMap's name (default DefaultConfigMapName).
	Name string
	// MinRefresh is the least time between two reads of the ConfigMap on a
	// miss (default 30 s), so reports naming unknown chips cannot turn into
	// a stream of API requests.
	MinRefresh time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// ConfigMapStore is an snp.Store in one ConfigMap's binaryData, keyed by
// snp.VCEKFileName, so every verifier replica shares the VCEKs any of them
// fetched (the role Constellation's certcache plays). VCEKs are public
// certificates, so a ConfigMap (not a Secret) is the right home.
type ConfigMapStore struct {
	cfg     Config
	mu      sync.Mutex
	data    map[string][]byte
	fetched time.Time
}

var _ snp.Store = (*ConfigMapStore)(nil)

// New returns a store over cfg's ConfigMap. Nothing is read until the
// first Get.
func New(cfg Config) (*ConfigMapStore, error) {
	if cfg.Client == nil || cfg.Namespace == "" {
		return nil, errors.New("configmap store: client and namespace are required")
	}
	if cfg.Name == "" {
		cfg.Name = DefaultConfigMapName
	}
	if cfg.MinRefresh == 0 {
		cfg.MinRefresh = defaultMinRefresh
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &ConfigMapStore{cfg: cfg, data: map[string][]byte{}}, nil
}

// Get returns the certificate under name, re-reading the ConfigMap when it
// is not known locally and the last read is older than MinRefresh.
func (s *ConfigMapStore) Get(ctx context.Context, name string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if der, ok := s.data[name]; ok {
		return der, nil
	}
	now := s.cfg.Now()
	if !s.fetched.IsZero() && now.Sub(s.fetched) < s.cfg.MinRefresh {
		return nil, snp.ErrCollateralMissing
	}
	s.fetched = now
	cm, err := s.cfg.Client.CoreV1().ConfigMaps(s.cfg.Namespace).Get(ctx, s.cfg.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, snp.ErrCollateralMissing
	}
	if err != nil {
		return nil, fmt.Errorf("read configmap %s/%s: %w", s.cfg.Namespace, s.cfg.Name, err)
	}
	maps.Copy(s.data, cm.BinaryData)
	if der, ok := s.data[name]; ok {
		return der, nil
	}
	return nil, snp.ErrCollateralMissing
}

// Put adds der under name to the ConfigMap, creating it when absent and
// retrying on write conflicts with other replicas.
func (s *ConfigMapStore) Put(ctx context.Context, name string, der []byte) error {
	cms := s.cfg.Client.CoreV1().ConfigMaps(s.cfg.Namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, s.cfg.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = cms.Create(ctx, s.newConfigMap(name, der), metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(corev1.Resource("configmaps"), s.cfg.Name, err)
			}
			return err
		}
		if err != nil {
			return err
		}
		if bytes.Equal(cm.BinaryData[name], der) {
			return nil
		}
		if dataSize(cm)+len(name)+len(der) > maxConfigMapData {
			return fmt.Errorf("configmap %s/%s is full", s.cfg.Namespace, s.cfg.Name)
		}
		if cm.BinaryData == nil {
			cm.BinaryData = map[string][]byte{}
		}
		cm.BinaryData[name] = der
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("write configmap %s/%s: %w", s.cfg.Namespace, s.cfg.Name, err)
	}
	s.mu.Lock()
	s.data[name] = der
	s.mu.Unlock()
	return nil
}

func (s *ConfigMapStore) newConfigMap(name string, der []byte) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name:      s.cfg.Name,
			Namespace: s.cfg.Namespace,
			Labels: map[string]string{
				"app.kubernetes.io/name":       "latchkey",
				"app.kubernetes.io/component":  "snp-collateral",
				"app.kubernetes.io/managed-by": "latchkey-verifier",
			},
		},
		BinaryData: map[string][]byte{name: der},
	}
}

func dataSize(cm *corev1.ConfigMap) int {
	n := 0
	for k, v := range cm.BinaryData {
		n += len(k) + len(v)
	}
	for k, v := range cm.Data {
		n += len(k) + len(v)
	}
	return n
}
