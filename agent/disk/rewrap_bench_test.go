package disk

import "testing"

// BenchmarkRewrapInMemory is the CPU a boot spends on a rewrap before its
// first write: unlock the keyslot with the old key, AF-split and encrypt
// the volume key under the new one, and prove the new header (validation
// and a luks.go unseal). The writes (four, each synced) are the device's.
func BenchmarkRewrapInMemory(b *testing.B) {
	head := headerFixture(b, fixtureUUID, genKey(0))
	h, err := validateHeader(head, fixtureUUID)
	if err != nil {
		b.Fatal(err)
	}
	keys := ticketKeys(1, &h.generation)
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
		if _, err := unsealDetached(head, genKey(0), "", DataOffset+mib); err != nil {
			b.Fatal(err)
		}
	}
}
