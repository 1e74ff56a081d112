package load

// The yardstick: one bare ECDSA P-384 verification of a report signature,
// the part of a join no verifier can avoid.

import (
	"crypto/ecdsa"
	"crypto/sha512"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	"golang.org/x/sys/unix"

	"github.com/latchkey/latchkey/attest/snp/snptest"
)

// p384Result is one measurement of the bare verification.
type p384Result struct {
	ops  int
	cpu  time.Duration // thread CPU time of all ops
	wall time.Duration
}

func (r p384Result) perOp() time.Duration     { return r.cpu / time.Duration(r.ops) }
func (r p384Result) wallPerOp() time.Duration { return r.wall / time.Duration(r.ops) }

// p384Input is a real report's signature by the signer's VCEK: the same
// key, digest size and signature the verifier checks on every join.
type p384Input struct {
	pub    *ecdsa.PublicKey
	digest [sha512.Size384]byte
	sig    []byte
}

func newP384Input(tb testing.TB, s *snptest.Signer) p384Input {
	tb.Helper()
	raw := s.Report(make([]byte, 32))
	sig, err := abi.ReportToSignatureDER(raw)
	if err != nil {
		tb.Fatal(err)
	}
	in := p384Input{pub: s.AMD.Vcek.PublicKey.(*ecdsa.PublicKey), digest: sha512.Sum384(abi.SignedComponent(raw)), sig: sig}
	if !ecdsa.VerifyASN1(in.pub, in.digest[:], in.sig) {
		tb.Fatal("the report signature does not verify")
	}
	return in
}

// measureP384 runs ecdsa.VerifyASN1 on one goroutine locked to its OS
// thread until that thread has spent budget of CPU, and reports the
// thread's CPU time per verification (so other load on the machine does
// not inflate it, as it does not inflate the verifier's CPU time).
func measureP384(tb testing.TB, in p384Input, budget time.Duration) p384Result {
	tb.Helper()
	out := make(chan p384Result, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var r p384Result
		wall0, cpu0 := time.Now(), threadCPU()
		for r.cpu < budget || r.ops < 100 {
			for range 10 {
				if !ecdsa.VerifyASN1(in.pub, in.digest[:], in.sig) {
					panic("bare P-384 verification failed")
				}
			}
			r.ops += 10
			r.cpu = threadCPU() - cpu0
		}
		r.wall = time.Since(wall0)
		out <- r
	}()
	return <-out
}

func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		panic(err)
	}
	return time.Duration(ts.Nano())
}

// sampleP384 measures the bare verification while the load runs, in short
// bursts (two verifications every 20 ms, under a tenth of a core), so it
// sees the same contended caches and cores as the verifier's own
// verification. It stops when stop is closed.
func sampleP384(in p384Input, stop <-chan struct{}) <-chan p384Result {
	out := make(chan p384Result, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var r p384Result
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			w0, c0 := time.Now(), threadCPU()
			for range 2 {
				if !ecdsa.VerifyASN1(in.pub, in.digest[:], in.sig) {
					panic("bare P-384 verification failed")
				}
			}
			r.cpu += threadCPU() - c0
			r.wall += time.Since(w0)
			r.ops += 2
			select {
			case <-stop:
				out <- r
				return
			case <-t.C:
			}
		}
	}()
	return out
}
