package tdx

import (
	"bytes"
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tdx/tdxtest"
	"github.com/latchkey/latchkey/attest/tdx/wire"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// len is the number of cached chains.
func (c *pckCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// TestPCKCache: a platform's second quote reuses its verified chain; a
// chain with other bytes is verified afresh (and refused when it does not
// chain), and outside the chain's validity the cached entry is not used,
// so the refusal is the uncached one.
func TestPCKCache(t *testing.T) {
	x := newSigned(t, tdxtest.Collateral{}, nil)
	if _, err := x.validate(t, false); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if n := x.v.pck.len(); n != 1 {
		t.Fatalf("%d cached chains, want 1", n)
	}
	var first *pckInfo
	for _, e := range x.v.pck.entries {
		first = e.info
	}
	if _, err := x.validate(t, false); err != nil {
		t.Fatalf("Validate again: %v", err)
	}
	for _, e := range x.v.pck.entries {
		if e.info != first || x.v.pck.len() != 1 {
			t.Fatal("the second quote of the platform verified its chain again")
		}
	}
	t.Run("other chain", func(t *testing.T) {
		other := tdxtest.New(t, verifyTime) // its own root, not trusted
		binding := bytes.Repeat([]byte{0x42}, attest.BindingSize)
		rd, _ := wire.ReportData(binding)
		_, err := attest.Validate(context.Background(), x.v, evidenceOf(t, other.Quote(other.Body(), rd)), binding, nil)
		wantRefusal(t, err, latchkeyv1.Reason_UNTRUSTED_CHAIN, "PCK certificate does not chain to a trusted root")
	})
	t.Run("expired", func(t *testing.T) {
		x.v.now = func() time.Time { return verifyTime.AddDate(1, 0, 1) }
		_, err := x.validate(t, false)
		wantRefusal(t, err, latchkeyv1.Reason_UNTRUSTED_CHAIN, "PCK certificate does not chain to a trusted root: x509: certificate has expired")
	})
	t.Run("not yet valid", func(t *testing.T) {
		x.v.now = func() time.Time { return verifyTime.AddDate(-1, 0, -1) }
		_, err := x.validate(t, false)
		wantRefusal(t, err, latchkeyv1.Reason_UNTRUSTED_CHAIN, "PCK certificate does not chain to a trusted root: x509: certificate has expired or is not yet valid")
	})
}

// TestPCKCacheBound: the cache holds at most maxPCKCacheEntries chains
// and evicts the oldest.
func TestPCKCacheBound(t *testing.T) {
	x := newSigned(t, tdxtest.Collateral{}, nil)
	if _, err := x.validate(t, false); err != nil {
		t.Fatal(err)
	}
	var info *pckInfo
	for _, e := range x.v.pck.entries {
		info = e.info
	}
	c := newPCKCache()
	for i := range maxPCKCacheEntries + 1 {
		c.put(sha256.Sum256([]byte{byte(i), byte(i >> 8)}), info)
	}
	if n := c.len(); n != maxPCKCacheEntries {
		t.Fatalf("%d entries, want %d", n, maxPCKCacheEntries)
	}
	if c.get(sha256.Sum256([]byte{0, 0}), verifyTime) != nil || c.get(sha256.Sum256([]byte{1, 0}), verifyTime) == nil {
		t.Fatal("the oldest entry was not the one evicted")
	}
}
