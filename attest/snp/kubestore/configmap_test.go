package kubestore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"sync"
	"testing"
	"time"

	test "github.com/google/go-sev-guest/testing"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/snp"
	"github.com/latchkey/latchkey/attest/snp/kubestore"
	"github.com/latchkey/latchkey/attest/snp/snptest"
)

func newCollateral(t *testing.T, cfg snp.CollateralConfig) *snp.Collateral {
	t.Helper()
	c, err := snp.NewCollateral(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func fakeKDS(t *testing.T, s *snptest.Signer) *test.FakeKDS {
	t.Helper()
	k, err := test.FakeKDSFromSigner(s.AMD)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newStore(t *testing.T, client *fake.Clientset, now func() time.Time) *kubestore.ConfigMapStore {
	t.Helper()
	st, err := kubestore.New(kubestore.Config{Client: client, Namespace: "latchkey", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestConfigMapStoreSharesCollateralBetweenReplicas(t *testing.T) {
	s := snptest.New(t)
	ctx := context.Background()
	client := fake.NewClientset()
	// Replica A fetched the VCEK (e.g. `latchkey-verifier collateral fetch`).
	a := newCollateral(t, snp.CollateralConfig{Store: newStore(t, client, nil)})
	if _, err := a.Fetch(ctx, fakeKDS(t, s), "Milan", s.ChipID(), s.TCB()); err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	cm, err := client.CoreV1().ConfigMaps("latchkey").Get(ctx, kubestore.DefaultConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("ConfigMap not written: %v", err)
	}
	if !bytes.Equal(cm.BinaryData[snp.VCEKFileName(s.ChipID(), s.TCB())], s.VCEK()) {
		t.Errorf("ConfigMap binaryData = %v keys", len(cm.BinaryData))
	}
	// Replica B never fetched anything, has no directory, and validates.
	b := newCollateral(t, snp.CollateralConfig{Store: newStore(t, client, nil)})
	v, err := snp.NewValidator(s.Policy(), b)
	if err != nil {
		t.Fatal(err)
	}
	binding := make([]byte, 32)
	if _, err := rand.Read(binding); err != nil {
		t.Fatal(err)
	}
	if _, err := attest.Validate(ctx, v, s.EvidenceWithoutTable(binding), binding, nil); err != nil {
		t.Fatalf("replica B Validate: %v", err)
	}
}

func TestConfigMapStoreRefreshesAtMostEveryMinRefresh(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	now := time.Unix(1_800_000_000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	reader := newStore(t, client, clock)
	writer := newStore(t, client, nil)

	if _, err := reader.Get(ctx, "vcek-a"); !errors.Is(err, snp.ErrCollateralMissing) {
		t.Fatalf("Get before any write = %v, want ErrCollateralMissing", err)
	}
	if err := writer.Put(ctx, "vcek-a", []byte("der")); err != nil {
		t.Fatal(err)
	}
	if _, err := reader.Get(ctx, "vcek-a"); !errors.Is(err, snp.ErrCollateralMissing) {
		t.Errorf("Get within MinRefresh re-read the ConfigMap: %v", err)
	}
	mu.Lock()
	now = now.Add(31 * time.Second)
	mu.Unlock()
	if got, err := reader.Get(ctx, "vcek-a"); err != nil || string(got) != "der" {
		t.Errorf("Get after MinRefresh = %q, %v", got, err)
	}
}

func TestConfigMapStorePutRetriesConflicts(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	st := newStore(t, client, nil)
	if err := st.Put(ctx, "vcek-a", []byte("a")); err != nil {
		t.Fatal(err)
	}
	conflicts := 1
	client.PrependReactor("update", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts > 0 {
			conflicts--
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "configmaps"}, kubestore.DefaultConfigMapName, errors.New("stale"))
		}
		return false, nil, nil
	})
	if err := st.Put(ctx, "vcek-b", []byte("b")); err != nil {
		t.Fatalf("Put after a conflict: %v", err)
	}
	cm, _ := client.CoreV1().ConfigMaps("latchkey").Get(ctx, kubestore.DefaultConfigMapName, metav1.GetOptions{})
	if string(cm.BinaryData["vcek-a"]) != "a" || string(cm.BinaryData["vcek-b"]) != "b" || conflicts != 0 {
		t.Errorf("binaryData = %v, conflicts left %d", cm.BinaryData, conflicts)
	}
}
