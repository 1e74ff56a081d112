package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/agent/app"
	"github.com/latchkey/latchkey/agent/exitcode"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
)

// `latchkey-agent status` answers after the agent exited: the real binary
// boots against a real verifier (swtpm), exits, and a second process reads
// the last result it left, which names the verifier and the evidence
// digest the verifier's audit line names. A later failed run replaces it.
func TestStatusAfterExit(t *testing.T) {
	sim := tpmtest.Start(t)
	addr, pin := startVerifier(t, sim)
	dir := t.TempDir()
	socket, file := filepath.Join(dir, "admin.sock"), filepath.Join(dir, "run", "last.json")
	cfgPath := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfgPath, []byte("statusSocket: "+socket+"\nstatusFile: "+file+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := func(pin string, extra ...string) []string {
		return append([]string{"run", "--config", cfgPath, "--kernel-cmdline", "/dev/null", "--verifier", addr, "--pin", pin,
			"--tpm-device", sim.Device, "--node-name", "n1", "--disk-mode", "key-only",
			"--disk-uuid", "6c0e2f5a-4b1d-4e8f-9a3c-2d7b5e1f0a94", "--no-join", "--no-reattest", "--timeout", "20s"}, extra...)
	}
	status := func() (int, string) {
		code, out, _ := agentProcess(t, "status", "--socket", socket, "--status-file", file)
		return code, out
	}

	// Nothing ran yet: status says so and fails.
	if code, out := status(); code != StatusNotReady || !strings.Contains(out, "left no last result") {
		t.Fatalf("status before any run: %d %q", code, out)
	}
	if r, code := statusJSON(t, socket, file); code != StatusNotReady || r["source"] != "none" || r["ready"] != false {
		t.Fatalf("status --json before any run: exit %d, %v", code, r)
	}

	code, out, _ := agentProcess(t, args(pin)...)
	if code != exitcode.OK {
		t.Fatalf("boot: exit %d\n%s", code, out)
	}
	digest := between(t, out, "evidence_digest=", " ")
	code, st := status()
	for _, want := range []string{"agent: exited", ": ready", "stage:", "ready", "verifier:", addr,
		"evidence digest:", digest, "node:", "n1", "6c0e2f5a-4b1d-4e8f-9a3c-2d7b5e1f0a94", "variant:", "TPM"} {
		if code != exitcode.OK || !strings.Contains(st, want) {
			t.Fatalf("status after a successful boot: exit %d, lacks %q:\n%s", code, want, st)
		}
	}
	checkFile(t, file, "ready", exitcode.OK)
	if r, code := statusJSON(t, socket, file); code != exitcode.OK || r["result"] != "ready" || r["ready"] != true ||
		r["source"] != "last-result" || r["evidenceDigest"] != digest || r["node"] != "n1" || r["variant"] != "tpm" {
		t.Fatalf("status --json after a successful boot: exit %d, %v", code, r)
	}

	// A wrong pin: the agent exits 7, and status tells that, not the old
	// success.
	code, out, took := agentProcess(t, args("sha256:"+strings.Repeat("ab", 32), "--timeout", "2s")...)
	t.Logf("wrong pin refused in %v", took)
	if code != exitcode.VerifierNotAuthenticated {
		t.Fatalf("wrong pin: exit %d\n%s", code, out)
	}
	code, st = status()
	if code != StatusNotReady || !strings.Contains(st, ": failed") || !strings.Contains(st, "exit code:") ||
		!strings.Contains(st, exitcode.Name(exitcode.VerifierNotAuthenticated)) || strings.Contains(st, digest) {
		t.Fatalf("status after a wrong pin: exit %d\n%s", code, st)
	}
	checkFile(t, file, "failed", exitcode.VerifierNotAuthenticated)
	if r, code := statusJSON(t, socket, file); code != StatusNotReady || r["result"] != "failed" || r["ready"] != false ||
		r["exitCode"] != float64(exitcode.VerifierNotAuthenticated) || r["exit"] != exitcode.Name(exitcode.VerifierNotAuthenticated) {
		t.Fatalf("status --json after a wrong pin: exit %d, %v", code, r)
	}

	// A bad configuration replaces it too.
	code, _, _ = agentProcess(t, args(pin, "--node-name", "Bad_Name")...)
	if code != exitcode.BadConfig {
		t.Fatalf("bad node name: exit %d", code)
	}
	if _, st = status(); !strings.Contains(st, "bad configuration") || !strings.Contains(st, exitcode.Name(exitcode.BadConfig)) {
		t.Fatalf("status after a bad configuration:\n%s", st)
	}
}

// A running agent answers on its socket; one killed (SIGKILL: no chance
// to write a result) leaves its "running" record and a stale socket, and
// status says it is not answering instead of showing an older result.
func TestStatusOfKilledAgent(t *testing.T) {
	sim := tpmtest.Start(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never speaks TLS
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	dir := t.TempDir()
	socket, file := filepath.Join(dir, "admin.sock"), filepath.Join(dir, "last.json")
	cfgPath := filepath.Join(dir, "agent.yaml")
	os.WriteFile(cfgPath, []byte("statusSocket: "+socket+"\nstatusFile: "+file+"\n"), 0o600)
	cmd := exec.Command(os.Args[0], "run", "--config", cfgPath, "--kernel-cmdline", "/dev/null", "--verifier", lis.Addr().String(),
		"--pin", "sha256:"+strings.Repeat("ab", 32), "--tpm-device", sim.Device, "--node-name", "n1", "--disk-mode", "key-only",
		"--disk-uuid", "6c0e2f5a-4b1d-4e8f-9a3c-2d7b5e1f0a94", "--no-join", "--timeout", "1m")
	cmd.Env = append(os.Environ(), "LATCHKEY_AGENT_TEST_MAIN=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	var st string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var code int
		code, st, _ = agentProcess(t, "status", "--socket", socket, "--status-file", file)
		if code == 0 && strings.Contains(st, "attesting to "+lis.Addr().String()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the running agent never answered status:\n%s", st)
		}
	}
	if strings.Contains(st, "agent: ") {
		t.Fatalf("a live answer printed as a last result:\n%s", st)
	}
	cmd.Process.Kill()
	cmd.Wait()
	killed = true
	code, st, _ := agentProcess(t, "status", "--socket", socket, "--status-file", file)
	if code != StatusNotReady || !strings.Contains(st, fmt.Sprintf("agent: not answering: pid %d started", cmd.Process.Pid)) || !strings.Contains(st, "left no result") {
		t.Fatalf("status of a killed agent: exit %d\n%s", code, st)
	}
}

// statusFields are `status --json`'s field names, documented in
// docs/configuration.md: a stable interface, so a rename fails here.
var statusFields = []string{"source", "result", "stage", "stageSince", "exitCode", "exit", "node", "diskUUID", "rejoin",
	"variant", "verifier", "attempt", "evidenceDigest", "tokenID", "reason", "error", "status", "pid", "ready"}

// statusJSON runs `status --json` and decodes it strictly (every field
// one of statusFields).
func statusJSON(t *testing.T, socket, file string) (map[string]any, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "status", "--json", "--socket", socket, "--status-file", file)
	cmd.Env = append(os.Environ(), "LATCHKEY_AGENT_TEST_MAIN=1")
	out, err := cmd.Output()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	for k := range m {
		if !slices.Contains(statusFields, k) {
			t.Fatalf("status --json: undocumented field %q", k)
		}
	}
	return m, code
}

// checkFile: the file is private, strictly decodable, and the directory
// holds nothing else (no temporary file left behind).
func checkFile(t *testing.T, path, result string, code int) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("last result %s: %v, mode %v; want 0600", path, err, fi.Mode())
	}
	r, err := app.ReadLastResult(path)
	if err != nil || r.Result != result || r.ExitCode != code || r.PID == 0 || r.Finished.IsZero() {
		t.Fatalf("last result %+v: %v", r, err)
	}
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Fatalf("%d files next to the last result, want 1", len(ents))
	}
	var m map[string]any
	data, _ := os.ReadFile(path)
	json.Unmarshal(data, &m)
	for k := range m {
		if !slices.Contains([]string{"result", "exitCode", "exit", "node", "diskUUID", "rejoin", "variant", "verifier",
			"attempts", "evidenceDigest", "tokenID", "reason", "error", "status", "finished", "pid"}, k) {
			t.Fatalf("unexpected field %q in the last result", k)
		}
	}
}

func between(t *testing.T, s, start, end string) string {
	t.Helper()
	i := strings.Index(s, start)
	if i < 0 {
		t.Fatalf("%q not in:\n%s", start, s)
	}
	rest := s[i+len(start):]
	if j := strings.IndexAny(rest, end+"\n"); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

// The status API and the "running" result come after the boot's first
// TPM command, so neither delays it: when that command reaches the TPM,
// neither the socket nor the result file exists, and the boot still
// leaves its result once it is done.
func TestStatusStartsAfterFirstTPMCommand(t *testing.T) {
	sim := tpmtest.Start(t)
	addr, pin := startVerifier(t, sim)
	relay := startTPMRelay(t, strings.TrimPrefix(sim.Device, "tcp://"))
	dir := t.TempDir()
	args := keyOnlyBoot(t, dir, addr, pin, "tcp://"+relay.addr)
	socket, file := filepath.Join(dir, "admin.sock"), filepath.Join(dir, "last.json")
	var atFirst []string
	relay.onFirst = func() {
		for _, p := range []string{socket, file} {
			if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
				atFirst = append(atFirst, fmt.Sprintf("%s: %v", p, err))
			}
		}
	}
	relay.mark()
	if code, out, _ := agentProcess(t, args...); code != 0 {
		t.Fatalf("boot exit %d:\n%s", code, out)
	}
	if relay.first.Load() == 0 {
		t.Fatal("no TPM command went through the relay")
	}
	if len(atFirst) > 0 {
		t.Fatalf("made before the first TPM command: %v", atFirst)
	}
	if r, err := app.ReadLastResult(file); err != nil || r.Result != "ready" {
		t.Fatalf("last result %+v: %v", r, err)
	}
}
