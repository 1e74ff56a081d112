package tpm_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tpm"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
)

// BenchmarkValidate measures the verifier's CPU cost per TPM join.
//
// pinned-ak: evidence from swtpm, validated against a policy that pins its
// AK and lists its 13 PCRs; no TPM involved, so this is validation alone.
// cpu-ns/op is the process CPU time per validation (GC included), the
// figure to trust on a loaded machine.
//
// ek-certificate: the EK certificate chain plus credential activation. The
// challenge is answered in-process by a pre-made attestation on swtpm; the
// time spent in that round trip (the agent's TPM2_ActivateCredential) is
// subtracted and reported as tpm-ns/op, leaving verifier-ns/op (wall);
// cpu-ns/op is this process's CPU time, i.e. the verifier plus the small
// client side of the agent's Respond (swtpm runs in its own process).
func BenchmarkValidate(b *testing.B) {
	sim := tpmtest.Start(b)
	iss, err := tpm.NewIssuer(tpm.IssuerConfig{Device: sim.Device})
	if err != nil {
		b.Fatal(err)
	}
	binding := newBinding(b)
	a, err := iss.Attest(context.Background(), binding)
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	ek := mustValidate(b, tpm.Policy{EKCARoots: sim.EKCARootsPEM}, a, binding)
	pinned := tpm.Policy{PCRs: pcrPolicy(ek.PCRs), AKPublicKeyHashes: []string{ek.AKPublicKeyHash}}

	b.Run("pinned-ak", func(b *testing.B) {
		v := newValidator(b, pinned)
		b.ReportAllocs()
		cpu := processCPU(b)
		for b.Loop() {
			if _, err := v.Validate(context.Background(), a.Evidence(), binding, nil); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64((processCPU(b)-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
	})
	b.Run("ek-certificate", func(b *testing.B) {
		v := newValidator(b, tpm.Policy{PCRs: pinned.PCRs, EKCARoots: sim.EKCARootsPEM})
		var inTPM time.Duration
		rt := func(ctx context.Context, ch []byte) ([]byte, error) {
			start := time.Now()
			defer func() { inTPM += time.Since(start) }()
			return a.Respond(ctx, ch)
		}
		start, cpu := time.Now(), processCPU(b)
		for b.Loop() {
			if _, err := v.Validate(context.Background(), a.Evidence(), binding, rt); err != nil {
				b.Fatal(err)
			}
		}
		total := time.Since(start)
		b.ReportMetric(float64((processCPU(b)-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
		b.ReportMetric(float64(inTPM.Nanoseconds())/float64(b.N), "tpm-ns/op")
		b.ReportMetric(float64((total-inTPM).Nanoseconds())/float64(b.N), "verifier-ns/op")
	})
}

// BenchmarkQuoteSwtpm measures the agent's cost of one attestation on
// swtpm: open, load EK (persisted) and AK, quote the default PCRs, read
// them and the EK certificate, flush, close.
func BenchmarkQuoteSwtpm(b *testing.B) {
	sim := tpmtest.Start(b)
	iss, err := tpm.NewIssuer(tpm.IssuerConfig{Device: sim.Device})
	if err != nil {
		b.Fatal(err)
	}
	binding := newBinding(b)
	for b.Loop() {
		a, err := iss.Attest(context.Background(), binding)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// processCPU is the user+system CPU time of the test process. On a shared
// machine it measures the validation cost where wall time (ns/op) also
// counts time spent waiting for a core.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func mustValidate(b *testing.B, p tpm.Policy, a attest.Attestation, binding []byte) *tpm.State {
	b.Helper()
	got, err := newValidator(b, p).Validate(context.Background(), a.Evidence(), binding, a.Respond)
	if err != nil {
		b.Fatal(err)
	}
	return got.State.(*tpm.State)
}
