package tpmtest

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"
)

// ClevisEncrypt seals key with Clevis' tpm2 pin (sha256 bank) to the
// PCRs pcrIDs ("0,7,11") of s, or returns nil, saying why, when Clevis'
// tpm2 pin is not installed: benchmarks then measure latchkey alone.
func (s *Simulator) ClevisEncrypt(tb testing.TB, key []byte, pcrIDs string) []byte {
	tb.Helper()
	if _, err := exec.LookPath("clevis-encrypt-tpm2"); err != nil {
		tb.Log("clevis tpm2 pin not installed (apt-get install clevis clevis-tpm2): measuring without it")
		return nil
	}
	cmd := s.clevis("encrypt", "tpm2", `{"pcr_bank":"sha256","pcr_ids":"`+pcrIDs+`"}`)
	cmd.Stdin = bytes.NewReader(key)
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("clevis encrypt: %v: %s", err, stderrOf(err))
	}
	return out
}

// ClevisDecrypt runs `clevis decrypt` of jwe against s, fails tb unless
// it yields want, and returns its wall time and the CPU time of its whole
// process tree (the shell scripts, jose and the tpm2-tools they run);
// swtpm's own CPU is not in it.
func (s *Simulator) ClevisDecrypt(tb testing.TB, jwe, want []byte) (wall, cpu time.Duration) {
	tb.Helper()
	cmd := s.clevis("decrypt")
	cmd.Stdin = bytes.NewReader(jwe)
	start := time.Now()
	out, err := cmd.Output()
	wall = time.Since(start)
	if err != nil || !bytes.Equal(out, want) {
		tb.Fatalf("clevis decrypt: %v: %s", err, stderrOf(err))
	}
	return wall, cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
}

// clevis runs Clevis with the tpm2-tools pointed at s.
func (s *Simulator) clevis(args ...string) *exec.Cmd {
	cmd := exec.Command("clevis", args...)
	cmd.Env = append(os.Environ(), "TPM2TOOLS_TCTI="+s.TCTI())
	return cmd
}

func stderrOf(err error) []byte {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.Stderr
	}
	return nil
}
