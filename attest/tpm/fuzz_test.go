package tpm_test

import (
	"crypto/sha256"
	"testing"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tpm/bootlog"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// FuzzVerifyBoot feeds arbitrary firmware and systemd logs to the log
// decoding, replay and extraction path. The PCRs are the input's own
// naive replay, so most inputs get past the replay into go-eventlog's
// extractors and systemd-stub's section parsing. It must never panic and
// must fail only with MALFORMED or EVENT_LOG_MISMATCH. Run briefly in CI:
//
//	go test ./attest/tpm/ -run '^$' -fuzz FuzzVerifyBoot -fuzztime 20s -fuzzminimizetime 2s
func FuzzVerifyBoot(f *testing.F) {
	der, _ := dbCert(f, "fuzz db")
	good := tpmtest.OVMFLog(ukiBoot(f, der))
	passed := ukiBoot(f, der)
	passed.Cmdline, passed.Passed = "console=ttyS0", true
	sd := tpmtest.SystemdLog(map[int][32]byte{}, tpmtest.SystemdRecord{PCR: 11, EventType: "phase", String: "enter-initrd"})
	f.Add(good.Bytes(), []byte(nil))
	f.Add(tpmtest.OVMFLog(passed).Bytes(), sd)
	f.Add(good.Bytes()[:100], []byte("\x1e{\"pcr\":99}\n"))
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, fw, sdLog []byte) {
		pcrs := map[int][32]byte{}
		for p := range 24 {
			pcrs[p] = [32]byte{}
		}
		if el, err := tcg.ParseEventLog(fw, tcg.ParseOpts{}); err == nil {
			for _, e := range el.Events(register.HashSHA256) {
				if e.Type != tcg.NoAction && e.Index >= 0 && e.Index < 24 && len(e.Digest) == 32 {
					v := pcrs[e.Index]
					pcrs[e.Index] = sha256.Sum256(append(v[:], e.Digest...))
				}
			}
		}
		_, err := bootlog.Verify(pcrs, fw, sdLog)
		if r := attest.ReasonOf(err); err != nil && r != latchkeyv1.Reason_MALFORMED && r != latchkeyv1.Reason_EVENT_LOG_MISMATCH {
			t.Fatalf("VerifyBoot failed with %v: %v", r, err)
		}
	})
}
