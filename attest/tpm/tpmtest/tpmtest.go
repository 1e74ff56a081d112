// Package tpmtest starts a real software TPM (swtpm) for tests: manufactured
// by swtpm_setup with an RSA and an ECC endorsement key, EK certificates in
// their TCG NV indices and a platform certificate, all issued by a
// throwaway local CA whose certificates the test can put in a policy.
//
// It imports testing and must only be imported from _test.go files (or
// other test helpers), never from the shipped binaries.
//
// swtpm has no resource manager: it holds three transient objects, and it
// serves one command connection at a time (a second client waits until the
// first disconnects). Close every TPM connection before calling Extend or
// Restart.
package tpmtest

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/latchkey/latchkey/attest/tpm"
)

// tools are the programs Start needs; Debian ships them in swtpm and
// swtpm-tools.
var tools = []string{"swtpm", "swtpm_setup", "swtpm_localca", "swtpm_ioctl"}

const (
	readyTimeout = 10 * time.Second
	busyTimeout  = 20 * time.Second
	// firstTransient and firstLoadedSession start the handle ranges of
	// transient objects and loaded sessions (TPM 2.0 Part 2, 7.2).
	firstTransient     = 0x80000000
	firstLoadedSession = 0x02000000
)

// Simulator is one running swtpm process.
type Simulator struct {
	// Device is the address to give tpm.OpenDevice ("tcp://127.0.0.1:N").
	Device string
	// EKCARootsPEM holds the local CA's root and intermediate (issuing)
	// certificates, PEM encoded. The TPM's NV index holds only the EK
	// leaf certificate, so a policy lists both as EK CA anchors.
	EKCARootsPEM []string

	dir      string
	cmdPort  int
	ctrlPort int
	proc     *exec.Cmd
	exited   chan struct{}
	stderr   bytes.Buffer
}

// Start runs a swtpm manufactured with EK certificates from a throwaway CA
// and stops it when the test ends. Manufacturing (swtpm_setup, about a
// second) runs once per test binary; every Start copies that state into its
// own temporary directory, so simulators share the same EK and CA but no
// runtime state. Use StartFresh for a TPM with its own EK and CA.
func Start(t testing.TB) *Simulator {
	t.Helper()
	tmpl, err := sharedTemplate()
	if err != nil {
		t.Fatalf("tpmtest: %v", err)
	}
	return startFrom(t, tmpl)
}

// StartFresh is Start with a newly manufactured TPM and CA, for tests that
// need two machines with different endorsement keys.
func StartFresh(t testing.TB) *Simulator {
	t.Helper()
	tmpl, err := manufacture(t.TempDir())
	if err != nil {
		t.Fatalf("tpmtest: %v", err)
	}
	return startFrom(t, tmpl)
}

var (
	templateOnce sync.Once
	templateVal  *template
	templateErr  error
)

// sharedTemplate manufactures the process-wide TPM state once and keeps
// it in memory, so no directory outlives the test that made it.
func sharedTemplate() (*template, error) {
	templateOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tpmtest-template-")
		if err != nil {
			templateErr = err
			return
		}
		defer os.RemoveAll(dir)
		templateVal, templateErr = manufacture(dir)
	})
	return templateVal, templateErr
}

func startFrom(t testing.TB, tmpl *template) *Simulator {
	t.Helper()
	s := &Simulator{dir: t.TempDir(), EKCARootsPEM: tmpl.caPEM}
	state := filepath.Join(s.dir, "state")
	if err := writeDir(state, tmpl.state); err != nil {
		t.Fatalf("tpmtest: copy tpm state: %v", err)
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ { // a free port can be taken before swtpm binds it
		if lastErr = s.launch(state); lastErr == nil {
			t.Cleanup(s.stop)
			return s
		}
	}
	t.Fatalf("tpmtest: start swtpm: %v", lastErr)
	return nil
}

// CheckTools fails the test with an installation hint when a swtpm
// program is missing.
func CheckTools(t testing.TB) {
	t.Helper()
	if err := lookTools(); err != nil {
		t.Fatalf("tpmtest: %v", err)
	}
}

func lookTools() error {
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found in PATH: install swtpm and swtpm-tools (apt-get install swtpm swtpm-tools)", tool)
		}
	}
	return nil
}

// launch starts swtpm on two free loopback ports and waits until its
// command port accepts connections.
func (s *Simulator) launch(state string) error {
	port, err := freePortPair()
	if err != nil {
		return err
	}
	s.cmdPort, s.ctrlPort = port, port+1
	s.stderr.Reset()
	cmd := exec.Command("swtpm", "socket", "--tpm2",
		"--tpmstate", "dir="+state,
		"--server", fmt.Sprintf("type=tcp,port=%d,bindaddr=127.0.0.1", s.cmdPort),
		"--ctrl", fmt.Sprintf("type=tcp,port=%d,bindaddr=127.0.0.1", s.ctrlPort),
		"--flags", "not-need-init,startup-clear")
	cmd.Stdout, cmd.Stderr = &s.stderr, &s.stderr
	// Kill swtpm with the test binary even when it dies without cleanup.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run swtpm: %w", err)
	}
	s.proc, s.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(s.exited) }()
	if err := s.waitReady(); err != nil {
		s.stop()
		return fmt.Errorf("%w (swtpm output: %q)", err, s.stderr.String())
	}
	s.Device = "tcp://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(s.cmdPort))
	return nil
}

func (s *Simulator) waitReady() error {
	deadline := time.Now().Add(readyTimeout)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(s.cmdPort))
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			return errors.New("swtpm exited during start")
		default:
		}
		if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			return conn.Close()
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("swtpm not listening on %s after %v", addr, readyTimeout)
}

func (s *Simulator) stop() {
	if s.proc == nil || s.proc.Process == nil {
		return
	}
	_ = s.proc.Process.Kill()
	<-s.exited
}

// freePortPair finds two adjacent free loopback ports, N and N+1: the
// tpm2-tss swtpm TCTI (TCTI) expects the control port right after the
// command port.
func freePortPair() (int, error) {
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("find free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		next, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+1)))
		_ = l.Close()
		if err == nil {
			_ = next.Close()
			return port, nil
		}
	}
	return 0, errors.New("find free port: no two adjacent free loopback ports")
}

// TCTI is the tpm2-tss TCTI configuration that points tpm2-tools (and
// Clevis' tpm2 pin) at this swtpm, for TPM2TOOLS_TCTI.
func (s *Simulator) TCTI() string {
	return fmt.Sprintf("swtpm:host=127.0.0.1,port=%d", s.cmdPort)
}

// Extend extends PCR pcr of the SHA-256 bank with SHA-256(data), the way a
// boot component measures an event.
func (s *Simulator) Extend(t testing.TB, pcr int, data []byte) {
	t.Helper()
	digest := sha256.Sum256(data)
	s.withTPM(t, func(tp transport.TPM) error {
		_, err := tpm2.PCRExtend{
			PCRHandle: tpm2.AuthHandle{Handle: tpm2.TPMHandle(pcr), Auth: tpm2.PasswordAuth(nil)},
			Digests: tpm2.TPMLDigestValues{Digests: []tpm2.TPMTHA{
				{HashAlg: tpm2.TPMAlgSHA256, Digest: digest[:]},
			}},
		}.Execute(tp)
		return err
	})
}

// Restart power-cycles the TPM: persistent state (seeds, NV, EK
// certificates) survives, PCRs and loaded objects do not, as after a
// reboot.
func (s *Simulator) Restart(t testing.TB) {
	t.Helper()
	out, err := exec.Command("swtpm_ioctl", "--tcp",
		net.JoinHostPort("127.0.0.1", strconv.Itoa(s.ctrlPort)), "-i").CombinedOutput()
	if err != nil {
		t.Fatalf("tpmtest: swtpm_ioctl -i: %v: %s", err, out)
	}
	s.withTPM(t, func(tp transport.TPM) error {
		_, err := tpm2.Startup{StartupType: tpm2.TPMSUClear}.Execute(tp)
		if errors.Is(err, tpm2.TPMRCInitialize) { // swtpm already sent it
			return nil
		}
		return err
	})
}

// TransientHandles lists the transient objects loaded in the TPM; a test
// expects none once every attestation is closed.
func (s *Simulator) TransientHandles(t testing.TB) []tpm2.TPMHandle {
	t.Helper()
	return s.handles(t, firstTransient)
}

// LoadedSessions lists the authorization and policy sessions loaded in
// the TPM.
func (s *Simulator) LoadedSessions(t testing.TB) []tpm2.TPMHandle {
	t.Helper()
	return s.handles(t, firstLoadedSession)
}

func (s *Simulator) handles(t testing.TB, first uint32) []tpm2.TPMHandle {
	t.Helper()
	var handles []tpm2.TPMHandle
	s.withTPM(t, func(tp transport.TPM) error {
		rsp, err := tpm2.GetCapability{
			Capability:    tpm2.TPMCapHandles,
			Property:      first,
			PropertyCount: 64,
		}.Execute(tp)
		if err != nil {
			return err
		}
		hl, err := rsp.CapabilityData.Data.Handles()
		if err != nil {
			return err
		}
		for _, h := range hl.Handle {
			if uint32(h)>>24 == first>>24 { // the list runs on into the next range
				handles = append(handles, h)
			}
		}
		return nil
	})
	return handles
}

// FillTransientSlots loads n throwaway ECC keys and leaves them loaded
// (swtpm has no resource manager, so they outlive the connection), to
// make the code under test run out of object slots. They are flushed when
// the test ends.
func (s *Simulator) FillTransientSlots(t testing.TB, n int) []tpm2.TPMHandle {
	t.Helper()
	var handles []tpm2.TPMHandle
	s.withTPM(t, func(tp transport.TPM) error {
		for range n {
			rsp, err := tpm2.CreatePrimary{
				PrimaryHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
				InPublic:      tpm2.New2B(tpm2.ECCSRKTemplate),
			}.Execute(tp)
			if err != nil {
				return err
			}
			handles = append(handles, rsp.ObjectHandle)
		}
		return nil
	})
	t.Cleanup(func() {
		s.withTPM(t, func(tp transport.TPM) error {
			for _, h := range handles {
				if _, err := (tpm2.FlushContext{FlushHandle: h}).Execute(tp); err != nil {
					return err
				}
			}
			return nil
		})
	})
	return handles
}

// withTPM runs f on a connection of its own, closed before returning, as
// swtpm serves one connection at a time. A connection left open elsewhere
// (an Attestation not yet closed) would block f forever, so f gets
// busyTimeout and the test then fails saying why.
func (s *Simulator) withTPM(t testing.TB, f func(transport.TPM) error) {
	t.Helper()
	tp, err := tpm.OpenDevice(s.Device)
	if err != nil {
		t.Fatalf("tpmtest: %v", err)
	}
	defer tp.Close()
	done := make(chan error, 1)
	go func() { done <- f(tp) }()
	select {
	case err = <-done:
	case <-time.After(busyTimeout):
		_ = tp.Close() // unblocks f
		<-done
		t.Fatalf("tpmtest: swtpm did not answer within %v: it serves one connection at a time; close open attestations first", busyTimeout)
	}
	if err != nil {
		t.Fatalf("tpmtest: %v", err)
	}
}
