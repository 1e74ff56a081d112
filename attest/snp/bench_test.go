package snp_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha512"
	"crypto/x509"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	"golang.org/x/sys/unix"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/snp"
	"github.com/latchkey/latchkey/attest/snp/snptest"
	snpwire "github.com/latchkey/latchkey/attest/snp/wire"
)

// benchJoins is how many distinct signed reports the benchmarks cycle
// through (each bound to its own binding, as on real sessions).
const benchJoins = 64

type signedJoin struct{ evidence, binding []byte }

func benchSetup(b *testing.B) (*snp.Validator, []signedJoin) {
	b.Helper()
	s := snptest.New(b)
	v := newValidator(b, s.Policy(), nil)
	joins := make([]signedJoin, benchJoins)
	for i := range joins {
		binding := newBinding(b)
		joins[i] = signedJoin{evidence: s.Evidence(binding), binding: binding}
	}
	// Warm the chain cache: the first join of a chip verifies its chain.
	if _, err := attest.Validate(context.Background(), v, joins[0].evidence, joins[0].binding, nil); err != nil {
		b.Fatal(err)
	}
	return v, joins
}

// cpuMeter reports the process's CPU time (user+system, all threads, GC
// included) per operation as "cpu-ns/op". On a shared machine wall time
// per op swings with other people's load; CPU time per op does not, and it
// is what the verifier's throughput on dedicated cores follows.
type cpuMeter struct{ start time.Duration }

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startCPU(b *testing.B) *cpuMeter { return &cpuMeter{start: cpuTime(b)} }

func (m *cpuMeter) report(b *testing.B) {
	b.ReportMetric(float64(cpuTime(b)-m.start)/float64(b.N), "cpu-ns/op")
}

// BenchmarkValidate is the verifier's cost of one SNP join from a chip
// whose chain is cached: decode, one report signature verification, the
// policy checks.
func BenchmarkValidate(b *testing.B) {
	v, joins := benchSetup(b)
	ctx := context.Background()
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		m := startCPU(b)
		for i := 0; b.Loop(); i++ {
			j := joins[i%len(joins)]
			if _, err := attest.Validate(ctx, v, j.evidence, j.binding, nil); err != nil {
				b.Fatal(err)
			}
		}
		m.report(b)
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		m := startCPU(b)
		b.RunParallel(func(pb *testing.PB) {
			for i := 0; pb.Next(); i++ {
				j := joins[i%len(joins)]
				if _, err := attest.Validate(ctx, v, j.evidence, j.binding, nil); err != nil {
					b.Error(err)
					return
				}
			}
		})
		m.report(b)
	})
}

// BenchmarkValidateVsP384 alternates one Validate and one bare
// ecdsa.VerifyASN1 of the same report's signature by the same VCEK key on
// one locked OS thread, timing each with that thread's CPU clock, and
// reports both and their ratio. Alternating keeps both under the same
// machine load, so the ratio holds on a busy shared host where separate
// benchmarks drift. (GC work on other threads is not counted; see
// BenchmarkValidate's cpu-ns/op for the process-wide figure.)
func BenchmarkValidateVsP384(b *testing.B) {
	v, joins := benchSetup(b)
	pub, digests, sigs := bareVerifyInputs(b, joins)
	ctx := context.Background()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var validateCPU, verifyCPU time.Duration
	for i := 0; b.Loop(); i++ {
		j := joins[i%len(joins)]
		t0 := threadCPU(b)
		if _, err := attest.Validate(ctx, v, j.evidence, j.binding, nil); err != nil {
			b.Fatal(err)
		}
		t1 := threadCPU(b)
		if !ecdsa.VerifyASN1(pub, digests[i%len(joins)][:], sigs[i%len(joins)]) {
			b.Fatal("bare verify failed")
		}
		t2 := threadCPU(b)
		validateCPU += t1 - t0
		verifyCPU += t2 - t1
	}
	b.ReportMetric(float64(validateCPU)/float64(b.N), "validate-cpu-ns/op")
	b.ReportMetric(float64(verifyCPU)/float64(b.N), "p384-cpu-ns/op")
	b.ReportMetric(float64(validateCPU)/float64(verifyCPU), "ratio")
}

// bareVerifyInputs extracts each join's VCEK key, signed digest and
// signature, so the bare verification checks exactly what Validate does.
func bareVerifyInputs(b *testing.B, joins []signedJoin) (*ecdsa.PublicKey, [][48]byte, [][]byte) {
	var pub *ecdsa.PublicKey
	digests := make([][48]byte, len(joins))
	sigs := make([][]byte, len(joins))
	for i, j := range joins {
		ev, err := snpwire.DecodeEvidence(j.evidence)
		if err != nil {
			b.Fatal(err)
		}
		cert, err := x509.ParseCertificate(ev.Endorsement)
		if err != nil {
			b.Fatal(err)
		}
		pub = cert.PublicKey.(*ecdsa.PublicKey)
		digests[i] = sha512.Sum384(abi.SignedComponent(ev.Raw))
		if sigs[i], err = abi.ReportToSignatureDER(ev.Raw); err != nil {
			b.Fatal(err)
		}
	}
	return pub, digests, sigs
}

func threadCPU(b *testing.B) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ts.Nano())
}

// BenchmarkValidateFirstSight is the cost of a chip's first join after a
// start or policy reload: go-sev-guest's full chain verification.
func BenchmarkValidateFirstSight(b *testing.B) {
	s := snptest.New(b)
	p := s.Policy()
	binding := newBinding(b)
	evidence := s.Evidence(binding)
	ctx := context.Background()
	b.ReportAllocs()
	m := startCPU(b)
	for b.Loop() {
		v := newValidator(b, p, nil)
		if _, err := attest.Validate(ctx, v, evidence, binding, nil); err != nil {
			b.Fatal(err)
		}
	}
	m.report(b)
}

// BenchmarkP384Verify is the unavoidable part of a join: one bare
// ecdsa.VerifyASN1 on P-384 over the SHA-384 digest of a report's signed
// bytes, serial and parallel like BenchmarkValidate.
func BenchmarkP384Verify(b *testing.B) {
	key, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	report := make([]byte, abi.ReportSize)
	if _, err := rand.Read(report); err != nil {
		b.Fatal(err)
	}
	digest := sha512.Sum384(abi.SignedComponent(report))
	sig, err := ecdsa.SignASN1(rand.Reader, key, digest[:])
	if err != nil {
		b.Fatal(err)
	}
	b.Run("serial", func(b *testing.B) {
		m := startCPU(b)
		for b.Loop() {
			if !ecdsa.VerifyASN1(&key.PublicKey, digest[:], sig) {
				b.Fatal("verify failed")
			}
		}
		m.report(b)
	})
	b.Run("parallel", func(b *testing.B) {
		m := startCPU(b)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if !ecdsa.VerifyASN1(&key.PublicKey, digest[:], sig) {
					b.Error("verify failed")
					return
				}
			}
		})
		m.report(b)
	})
}
