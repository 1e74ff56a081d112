package main

import (
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"testing"
	"time"
)

// profileEnv names the file a verifier process started by a test writes
// its CPU profile to (LATCHKEY_ETCD_BENCH_PROFILE sets it per replica).
const profileEnv = "LATCHKEY_VERIFIER_TEST_CPUPROFILE"

// startTestProfile, in a verifier process a test started with
// profileEnv set, profiles the CPU until SIGUSR1, then writes the profile
// and renames it into place, so the test sees only a whole file.
func startTestProfile() {
	path := os.Getenv(profileEnv)
	if path == "" {
		return
	}
	f, err := os.Create(path + ".tmp")
	if err != nil {
		return
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return
	}
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		<-usr1
		pprof.StopCPUProfile()
		if f.Close() == nil {
			_ = os.Rename(path+".tmp", path)
		}
	}()
}

// saveProfile asks a replica started with profileEnv for its profile and
// waits until it is written.
func (r *loggedReplica) saveProfile(t testing.TB, path string) {
	t.Helper()
	if err := r.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		if _, err := os.Stat(path); err == nil {
			return
		}
		select {
		case <-r.done:
			t.Fatalf("replica exited before writing %s", path)
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("replica wrote no profile %s", path)
}
