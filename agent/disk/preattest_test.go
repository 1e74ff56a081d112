package disk_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anatol/luks.go"

	"github.com/latchkey/latchkey/agent/app"
	"github.com/latchkey/latchkey/agent/boot"
	"github.com/latchkey/latchkey/agent/disk"
	"github.com/latchkey/latchkey/agent/exitcode"
	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest/attesttest"
)

// What can be known before attestation is refused before it: the real
// boot (disk stage, then the real ticket client) on a device that cannot
// be used stops in the disk stage, and the verifier's listener never
// sees a connection, so no ticket (no key, no token) is handed out for a
// disk that cannot be used.

// countingVerifier is a loopback listener that counts connections. Its
// settled returns the count once every connection made before the call
// is accepted and counted: it makes one more connection and waits until
// the listener has accepted that one (the kernel queues connections for
// Accept first in, first out), which it does not count. A connection the
// code under test made, even one whose Accept was still in flight, is
// therefore never missed, and nothing waits a fixed time.
func countingVerifier(t *testing.T) (string, func() int32) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	var (
		mu     sync.Mutex
		n      int32
		seen   = map[string]bool{}
		notify = make(chan struct{}, 1)
	)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			n++
			seen[c.RemoteAddr().String()] = true
			mu.Unlock()
			select {
			case notify <- struct{}{}:
			default:
			}
			c.Close()
		}
	}()
	settled := func() int32 {
		c, err := net.Dial("tcp", lis.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		probe := c.LocalAddr().String()
		deadline := time.After(10 * time.Second)
		for {
			mu.Lock()
			done, count := seen[probe], n-1
			mu.Unlock()
			if done {
				return count
			}
			select {
			case <-notify:
			case <-deadline:
				t.Fatal("the listener did not accept the probe connection in 10s")
			}
		}
	}
	return lis.Addr().String(), settled
}

func loopDevice(t *testing.T, size int64, args ...string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices")
	}
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", append(append([]string{"--find", "--show"}, args...), img)...).Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	return dev
}

func sha(t *testing.T, dev string) [32]byte {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	io.Copy(h, f)
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s
}

// mappingKernel stands in for a kernel with device-mapper (it never gets
// as far as mapping here); the real SystemKernel is what the "no
// device-mapper" case uses.
type mappingKernel struct{}

func (mappingKernel) MapCrypt(context.Context, string, *luks.Volume) (string, error) {
	return "", errors.New("not reached")
}
func (mappingKernel) Mount(context.Context, string, string, string) error { return nil }
func (mappingKernel) Bind(context.Context, string, string) error          { return nil }

// noDeviceMapper skips when this kernel has device-mapper (the QEMU tier
// covers that path).
func noDeviceMapper(t *testing.T) {
	if err := (disk.SystemKernel{}).CanMap(context.Background()); err == nil {
		t.Skip("this kernel has device-mapper")
	}
}

func TestUnusableDiskRefusedBeforeAttestation(t *testing.T) {
	cases := []struct {
		name   string
		device func(t *testing.T) string
		fstype string
		want   string
		kernel disk.Kernel
	}{
		// The real kernel of this host has no device-mapper: a first
		// boot would write its header and then fail to map it.
		{"no device-mapper (the real kernel)", func(t *testing.T) string { noDeviceMapper(t); return loopDevice(t, 64<<20) }, "",
			"kernel has no device-mapper (the kernel needs CONFIG_BLK_DEV_DM and CONFIG_DM_CRYPT to open the state disk)", disk.SystemKernel{}},
		{"read-only (losetup -r)", func(t *testing.T) string { return loopDevice(t, 64<<20, "-r") }, "",
			"is read-only; the agent must write", nil},
		{"too small for xfs", func(t *testing.T) string { return loopDevice(t, 200<<20) }, "xfs",
			"too small for fsType xfs: it needs at least 331350016 bytes (316 MiB: 16 MiB of LUKS header and 300 MiB of file system); nothing was written", nil},
		{"vanished", func(t *testing.T) string { return filepath.Join(t.TempDir(), "by-id-gone") }, "",
			"not found (waited 300ms; vanished, or never attached?)", nil},
		// The control: a usable blank disk goes on to attest, and the
		// listener counts that connection.
		{"control: usable blank disk", func(t *testing.T) string { return loopDevice(t, 64<<20) }, "", "", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dev := c.device(t)
			var before [32]byte
			if _, err := os.Stat(dev); err == nil {
				before = sha(t, dev)
			}
			addr, settled := countingVerifier(t)
			log := slog.New(slog.DiscardHandler)
			tickets, err := ticket.New(ticket.Config{Endpoints: []string{addr}, InsecureSkipVerifierAuth: true,
				Issuer: &attesttest.Issuer{}, Timeout: 2 * time.Second, Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			kernel := c.kernel
			if kernel == nil {
				kernel = mappingKernel{}
			}
			stage, err := disk.NewLUKS(disk.LUKSConfig{Device: dev, FSType: c.fstype, WaitTimeout: 300 * time.Millisecond, Kernel: kernel,
				MountPoint: filepath.Join(t.TempDir(), "state"), BindMounts: []string{}, Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			b, err := boot.New(boot.Config{NodeName: "n1", Disk: stage, Tickets: tickets, Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			err = b.Run(context.Background())
			if c.want == "" {
				var se *boot.StageError
				if n := settled(); !errors.As(err, &se) || se.Stage != boot.StageTicket || n == 0 {
					t.Fatalf("control: %v after %d connections; want the ticket stage to have tried the verifier", err, n)
				}
				return
			}
			var se *boot.StageError
			if !errors.As(err, &se) || se.Stage != boot.StageDisk || !errors.Is(err, disk.ErrUnusable) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("boot: %v\nwant a disk-stage ErrUnusable saying %q", err, c.want)
			}
			if code := app.ExitCode(err); code != exitcode.DiskRefused {
				t.Fatalf("exit code %d, want %d (disk refused, nothing formatted)", code, exitcode.DiskRefused)
			}
			if c.kernel != nil && !errors.Is(err, disk.ErrNoDeviceMapper) {
				t.Fatalf("boot: %v, want ErrNoDeviceMapper", err)
			}
			if n := settled(); n != 0 {
				t.Fatalf("the verifier saw %d connections; a disk that cannot be used must be refused before attestation", n)
			}
			if _, err := os.Stat(dev); err == nil && sha(t, dev) != before {
				t.Fatal("device changed")
			}
			t.Logf("refusal: %v", err)
		})
	}
}
