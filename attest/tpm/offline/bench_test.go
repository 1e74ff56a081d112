package offline

import (
	"bytes"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest/tpm"
)

// BenchmarkOfflineUnlock measures the agent's offline unlock (open the
// TPM, recreate the SRK, load, verify the grant, evaluate the policy,
// unseal) next to `clevis decrypt` of a tpm2 pin sealed to the same PCRs
// of the same swtpm, alternating in one run. Clevis' CPU is its whole
// process tree (the shell script, jose and the tpm2-tools it runs);
// swtpm's own CPU is in neither figure.
//
//	go test -run '^$' -bench BenchmarkOfflineUnlock -benchtime 30x ./attest/tpm/offline/
func BenchmarkOfflineUnlock(b *testing.B) {
	m := newMachine(b, MaxBootsLimit, MaxHoursLimit)
	reboot(b, m.sim)
	jwe := clevisEncrypt(b, m)
	var offWall, offCPU, clWall, clCPU time.Duration
	b.ResetTimer()
	for range b.N {
		w, c := timeOffline(b, m)
		offWall, offCPU = offWall+w, offCPU+c
		if jwe != nil {
			w, c = timeClevis(b, m, jwe)
			clWall, clCPU = clWall+w, clCPU+c
		}
	}
	n := float64(b.N)
	b.ReportMetric(ms(offWall)/n, "offline-ms/op")
	b.ReportMetric(ms(offCPU)/n, "offline-cpu-ms/op")
	if jwe != nil {
		b.ReportMetric(ms(clWall)/n, "clevis-ms/op")
		b.ReportMetric(ms(clCPU)/n, "clevis-cpu-ms/op")
		b.ReportMetric(float64(offWall)/float64(clWall), "wall-ratio")
		b.ReportMetric(float64(offCPU)/float64(clCPU), "cpu-ratio")
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func timeOffline(b *testing.B, m *machine) (wall, cpu time.Duration) {
	cpu0, start := selfCPU(b), time.Now()
	tp, err := tpm.OpenDevice(m.sim.Device)
	if err != nil {
		b.Fatal(err)
	}
	key, _, err := Unseal(tp, m.sealed, m.grant)
	_ = tp.Close()
	wall, cpu = time.Since(start), selfCPU(b)-cpu0
	if err != nil || !bytes.Equal(key, m.key) {
		b.Fatalf("unseal: %v", err)
	}
	return wall, cpu
}

func selfCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// clevisEncrypt seals m's key with Clevis' tpm2 pin to the PCRs the grant
// names, or returns nil (and says why) when Clevis is not installed.
func clevisEncrypt(b *testing.B, m *machine) []byte {
	if _, err := exec.LookPath("clevis-encrypt-tpm2"); err != nil {
		b.Log("clevis tpm2 pin not installed (apt-get install clevis clevis-tpm2): measuring the offline unlock alone")
		return nil
	}
	cmd := clevis(m, "encrypt", "tpm2", `{"pcr_bank":"sha256","pcr_ids":"0,7,11"}`)
	cmd.Stdin = bytes.NewReader(m.key)
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("clevis encrypt: %v: %s", err, stderrOf(err))
	}
	return out
}

func timeClevis(b *testing.B, m *machine, jwe []byte) (wall, cpu time.Duration) {
	cmd := clevis(m, "decrypt")
	cmd.Stdin = bytes.NewReader(jwe)
	start := time.Now()
	out, err := cmd.Output()
	wall = time.Since(start)
	if err != nil || !bytes.Equal(out, m.key) {
		b.Fatalf("clevis decrypt: %v: %s", err, stderrOf(err))
	}
	return wall, cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
}

func clevis(m *machine, args ...string) *exec.Cmd {
	cmd := exec.Command("clevis", args...)
	cmd.Env = append(os.Environ(), "TPM2TOOLS_TCTI="+m.sim.TCTI())
	return cmd
}

func stderrOf(err error) []byte {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.Stderr
	}
	return nil
}
