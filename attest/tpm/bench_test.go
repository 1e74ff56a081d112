package tpm_test

import (
	"context"
	"encoding/hex"
	"os"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tpm"
	tpmissuer "github.com/latchkey/latchkey/attest/tpm/issuer"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
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
	iss, err := tpmissuer.New(tpmissuer.Config{Device: sim.Device})
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
			if _, err := attest.Validate(context.Background(), v, a.Evidence(), binding, nil); err != nil {
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
			if _, err := attest.Validate(context.Background(), v, a.Evidence(), binding, rt); err != nil {
				b.Fatal(err)
			}
		}
		total := time.Since(start)
		b.ReportMetric(float64((processCPU(b)-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
		b.ReportMetric(float64(inTPM.Nanoseconds())/float64(b.N), "tpm-ns/op")
		b.ReportMetric(float64((total-inTPM).Nanoseconds())/float64(b.N), "verifier-ns/op")
	})
	// replay: the same evidence on another session, against the EK
	// certificate policy: refused as BINDING_MISMATCH after one signature
	// check, no EK chain, no MakeCredential, no round trip.
	b.Run("replay", func(b *testing.B) {
		v := newValidator(b, tpm.Policy{PCRs: pinned.PCRs, EKCARoots: sim.EKCARootsPEM})
		other := newBinding(b)
		cpu := processCPU(b)
		for b.Loop() {
			if _, err := attest.Validate(context.Background(), v, a.Evidence(), other, nil); attest.ReasonOf(err) != latchkeyv1.Reason_BINDING_MISMATCH {
				b.Fatalf("replay: %v, want BINDING_MISMATCH", err)
			}
		}
		b.ReportMetric(float64((processCPU(b)-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
	})
}

// BenchmarkQuoteSwtpm measures the agent's cost of one attestation on
// swtpm: open, load EK (persisted) and AK, quote the default PCRs, read
// them and the EK certificate, flush, close.
func BenchmarkQuoteSwtpm(b *testing.B) {
	sim := tpmtest.Start(b)
	iss, err := tpmissuer.New(tpmissuer.Config{Device: sim.Device})
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
	got, err := attest.Validate(context.Background(), newValidator(b, p), a.Evidence(), binding, a.Respond)
	if err != nil {
		b.Fatal(err)
	}
	return got.State.(*tpm.State)
}

// BenchmarkValidateEventLog is the verifier's cost of the event-log
// replay and the component policy, against the same validation without
// them, in one run (pinned AK, so validation alone):
//
//   - pcrs-only: the real OVMF guest's quoted PCRs (testdata/ovmf-uki),
//     no log, a policy listing the PCRs;
//   - real-log: the same quote with the guest's real firmware log and a
//     component policy (UKI, command line, Secure Boot off allowed, phase);
//   - signed-secureboot: a synthesized Secure Boot log (one db
//     certificate), a boot loader, and the UKI admitted by a PCR 11
//     signature (RSA-2048), the heaviest policy path.
//
// cpu-ns/op is process CPU per validation; evidence-bytes the serialized
// TPMEvidence.
func BenchmarkValidateEventLog(b *testing.B) {
	log, err := os.ReadFile("testdata/ovmf-uki/binary_bios_measurements")
	if err != nil {
		b.Fatal(err)
	}
	cmdline, err := os.ReadFile("testdata/ovmf-uki/cmdline")
	if err != nil {
		b.Fatal(err)
	}
	pcrs := benchPCRs(b)
	ak := newCrafted(b, true)
	pcrPol := pcrPolicy(pcrs)
	der, pemText := dbCert(b, "bench db")
	sg := newSigner(b)
	sb := boot(b, ukiBoot(b, der), sysinit)
	sb.ak = ak
	sb.sig = sg.sign(b, sb.pcrs[11])
	cases := []struct {
		name string
		o    craftOpts
		pol  tpm.Policy
	}{
		{"pcrs-only", craftOpts{pcrs: pcrs}, tpm.Policy{PCRs: pcrPol, AKPublicKeyHashes: []string{ak.akHash}}},
		{"real-log", craftOpts{pcrs: pcrs, fw: log}, tpm.Policy{PCRs: pcrPol, AKPublicKeyHashes: []string{ak.akHash}, Boot: &tpm.BootPolicy{
			UKIs: []string{"sha256:" + realUKI}, KernelCmdlines: []string{string(cmdline)},
			SecureBoot: tpm.SecureBootPolicy{AllowDisabled: true}, PCR11Phases: []string{"sysinit"}}}},
		{"signed-secureboot", craftOpts{pcrs: sb.pcrs, fw: sb.log.Bytes(), sig: sb.sig}, tpm.Policy{PCRs: pcrPolicy(sb.pcrs), AKPublicKeyHashes: []string{ak.akHash}, Boot: &tpm.BootPolicy{
			BootLoaders: []string{dgst(loaderDigest)}, PCR11Signers: []string{sg.pem},
			SecureBoot: tpm.SecureBootPolicy{DBCertificates: []string{pemText}}}}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			binding := newBinding(b)
			ev := ak.evidenceWith(b, binding, c.o)
			v := newValidator(b, c.pol)
			b.ReportAllocs()
			cpu := processCPU(b)
			for b.Loop() {
				if _, err := attest.Validate(context.Background(), v, ev, binding, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((processCPU(b)-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(len(ev)), "evidence-bytes")
		})
	}
}

// benchPCRs are the real guest's quoted PCRs.
func benchPCRs(b *testing.B) map[int][32]byte {
	raw, err := os.ReadFile("testdata/ovmf-uki/latchkey-agent-measure.yaml")
	if err != nil {
		b.Fatal(err)
	}
	var m struct {
		TPM tpm.Policy `json:"tpm"`
	}
	if err := yaml.Unmarshal(raw, &m); err != nil {
		b.Fatal(err)
	}
	out := map[int][32]byte{}
	for idx, v := range m.TPM.PCRs {
		d, err := hex.DecodeString(v[0])
		if err != nil || len(d) != 32 {
			b.Fatalf("pcr %d", idx)
		}
		out[idx] = [32]byte(d)
	}
	return out
}
