package tdx

import (
	"crypto/sha256"
	"crypto/x509"
	"sync"
	"time"

	pb "github.com/google/go-tdx-guest/proto/tdx"
)

// maxPCKCacheEntries bounds the PCK chain cache: one entry per platform
// (a PCK certificate names one platform at one TCB), so a fleet larger
// than this only re-verifies some chains.
const maxPCKCacheEntries = 1024

// pckCache remembers PCK chains check 2 verified, keyed by SHA-256 of the
// chain's bytes as the quote carries them, so a platform's later quotes
// skip parsing and the two chain signature checks. It belongs to one
// Validator, hence to one set of trusted roots: a policy reload starts an
// empty cache. An entry is used only while the validator's clock is inside
// every chain certificate's validity (the window x509 verification checked
// the chain at); outside it, the chain is verified again, so the refusal
// is the one an uncached check gives. Revocation (check 4) is checked at
// every join whatever the cache holds.
type pckCache struct {
	mu      sync.Mutex
	entries map[[sha256.Size]byte]*pckEntry
	order   [][sha256.Size]byte // insertion order, for eviction
}

type pckEntry struct {
	info                *pckInfo
	notBefore, notAfter time.Time
}

func newPCKCache() *pckCache {
	return &pckCache{entries: map[[sha256.Size]byte]*pckEntry{}}
}

func chainKey(q *pb.QuoteV4) [sha256.Size]byte {
	return sha256.Sum256(q.GetSignedData().GetCertificationData().GetQeReportCertificationData().GetPckCertificateChainData().GetPckCertChain())
}

// get returns the cached chain for key when now is inside its window.
func (c *pckCache) get(key [sha256.Size]byte, now time.Time) *pckInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[key]
	if e == nil || now.Before(e.notBefore) || now.After(e.notAfter) {
		return nil
	}
	return e.info
}

// put remembers a verified chain, evicting the oldest entry when full.
func (c *pckCache) put(key [sha256.Size]byte, info *pckInfo) {
	e := &pckEntry{info: info}
	for i, cert := range []*x509.Certificate{info.leaf, info.intermediate, info.root} {
		if i == 0 || cert.NotBefore.After(e.notBefore) {
			e.notBefore = cert.NotBefore
		}
		if i == 0 || cert.NotAfter.Before(e.notAfter) {
			e.notAfter = cert.NotAfter
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[key]; !ok {
		if len(c.order) >= maxPCKCacheEntries {
			delete(c.entries, c.order[0])
			c.order = c.order[1:]
		}
		c.order = append(c.order, key)
	}
	c.entries[key] = e
}
