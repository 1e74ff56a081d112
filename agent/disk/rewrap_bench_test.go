package disk

import (
	"testing"

	"github.com/latchkey/latchkey/agent/disk/luks2"
)

// BenchmarkRewrapInMemory is the CPU a boot spends on a rewrap before its
// first write: unlock the keyslot with the old key, AF-split and encrypt
// the volume key under the new one, and prove the new header (validation
// and a luks.go unseal). The writes (four, each synced) are the device's.
func BenchmarkRewrapInMemory(b *testing.B) {
	head := headerFixture(b, fixtureUUID, genKey(0))
	h, err := luks2.Validate(head, fixtureUUID)
	if err != nil {
		b.Fatal(err)
	}
	keys := ticketKeys(1, &h.Generation)
	b.ReportAllocs()
	defer reportCPU(b)()
	for b.Loop() {
		if _, err := planRewrap(head, h, keys); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUnsealLuksGo is the unseal every boot does (luks.go on the
// detached header), for comparison.
func BenchmarkUnsealLuksGo(b *testing.B) {
	head := headerFixture(b, fixtureUUID, genKey(0))
	defer reportCPU(b)()
	for b.Loop() {
		if _, err := unsealDetached(head, genKey(0), "", luks2.DataOffset+mib); err != nil {
			b.Fatal(err)
		}
	}
}
