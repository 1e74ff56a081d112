package tdx

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest"
)

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkValidateTDX is the verifier's cost of one TDX join: Verify of
// go-tdx-guest's real quote with Intel's collateral from the on-disk
// cache, then the policy step (on the verified state with its platform
// TCB status set to UpToDate, since no level of the shipped TCB info
// matches this platform). It reports the process CPU per op as
// cpu-ns/op, comparable with attest/snp's BenchmarkValidate. Every join
// after the first takes the PCK chain from the validator's cache, as a
// platform's later joins do.
func BenchmarkValidateTDX(b *testing.B) { benchValidateTDX(b, false) }

// BenchmarkValidateTDXUncachedChain is BenchmarkValidateTDX with an empty
// PCK chain cache at every join (a platform's first join).
func BenchmarkValidateTDXUncachedChain(b *testing.B) { benchValidateTDX(b, true) }

func benchValidateTDX(b *testing.B, uncached bool) {
	dir := b.TempDir()
	if err := FetchCollateral(context.Background(), tdxGetter(), Policy{}, realFMSPC, "platform", dir, verifyTime); err != nil {
		b.Fatal(err)
	}
	coll, err := NewCollateral(CollateralConfig{Dir: dir})
	if err != nil {
		b.Fatal(err)
	}
	v, err := NewValidator(realPolicy(), coll, WithClock(func() time.Time { return verifyTime }), WithReportData(realReportData()))
	if err != nil {
		b.Fatal(err)
	}
	ev, err := encodeEvidence(realQuote)
	if err != nil {
		b.Fatal(err)
	}
	binding := make([]byte, attest.BindingSize)
	ctx := context.Background()
	b.ReportAllocs()
	b.ReportMetric(float64(len(realQuote)), "quote-bytes")
	start := cpuTime(b)
	for b.Loop() {
		if uncached {
			v.pck = newPCKCache()
		}
		ver, err := v.Verify(ctx, ev, binding, nil)
		if err != nil {
			b.Fatal(err)
		}
		st := ver.State.(*State)
		st.PlatformTCBStatus = "UpToDate"
		if err := v.CheckPolicy(st); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-ns/op")
}
