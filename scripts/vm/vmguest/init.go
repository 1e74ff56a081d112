//go:build linux

package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Paths inside the initrd, laid out by scripts/vm/build.sh.
const (
	moduleList = "/etc/modules.load" // module files to load, in order, one per line
	newRoot    = "/newroot"
	// rootWait bounds the wait for the root disk: virtio probing under TCG
	// takes a second or two, so this only fires when the disk is missing.
	rootWait = 30 * time.Second
)

// bootArgs are the kernel command line parameters the init honours.
type bootArgs struct {
	root   string // root=, default /dev/vda
	fstype string // rootfstype=, default ext4
	init   string // init=, default /sbin/init (systemd)
	ro     bool   // "ro" on the command line; the default is read-write
	verity verityArgs
}

// runInit is PID 1 of the initrd. It never returns: it either executes the
// real init or powers the machine off.
func runInit() {
	if err := bootstrap(); err != nil {
		logf("FATAL: %v; powering off", err)
		powerOff()
	}
}

// bootstrap performs every step up to exec'ing the real init.
func bootstrap() error {
	if err := mountEarly(); err != nil {
		return err
	}
	args, err := readBootArgs()
	if err != nil {
		return err
	}
	if err := loadModules(moduleList); err != nil {
		return err
	}
	if args.verity.rootHash != "" {
		if err := readOnlyCheck(args); err != nil {
			return err
		}
		node, err := openVerity(args.verity)
		if err != nil {
			return err
		}
		args.root = node
	}
	if err := waitFor(args.root, rootWait); err != nil {
		return err
	}
	if err := mountRoot(args); err != nil {
		return err
	}
	return switchRoot(args.init)
}

// mountEarly mounts the pseudo file systems the init needs to see devices,
// the command line and module state.
func mountEarly() error {
	mounts := []struct{ fstype, target string }{
		{"devtmpfs", "/dev"}, {"proc", "/proc"}, {"sysfs", "/sys"},
	}
	for _, m := range mounts {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			return fmt.Errorf("mkdir %s: %w", m.target, err)
		}
		if err := unix.Mount(m.fstype, m.target, m.fstype, unix.MS_NOSUID|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.target, err)
		}
	}
	return nil
}

// readBootArgs parses /proc/cmdline into bootArgs with their defaults.
func readBootArgs() (bootArgs, error) {
	raw, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return bootArgs{}, fmt.Errorf("read kernel command line: %w", err)
	}
	return parseBootArgs(string(raw))
}

// parseBootArgs extracts root=, rootfstype=, init=, ro and the dm-verity
// root (roothash=, systemd.verity_root_*=) from a command line. The last
// occurrence of a parameter wins, as in the kernel.
func parseBootArgs(cmdline string) (bootArgs, error) {
	a := bootArgs{root: "/dev/vda", fstype: "ext4", init: "/sbin/init"}
	a.verity = verityArgs{hashAlgorithm: "sha256", salt: "-", dataBlockSize: 4096, hashBlockSize: 4096, onCorruption: "panic"}
	var verityOpts string
	for _, f := range strings.Fields(cmdline) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "root":
			a.root = v
		case "rootfstype":
			a.fstype = v
		case "init":
			a.init = v
		case "ro":
			a.ro = true
		case "rw":
			a.ro = false
		case "roothash":
			a.verity.rootHash = v
		case "systemd.verity_root_data":
			a.verity.dataDevice = v
		case "systemd.verity_root_hash":
			a.verity.hashDevice = v
		case "systemd.verity_root_options":
			verityOpts = v
		}
	}
	if err := parseVerityOptions(&a.verity, verityOpts); err != nil {
		return bootArgs{}, err
	}
	return a, nil
}

// loadModules loads each module file listed in path, in order. A module
// that is already present (built in, or loaded twice) is not an error.
func loadModules(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open module list: %w", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		name := strings.TrimSpace(s.Text())
		if name == "" || strings.HasPrefix(name, "#") {
			continue
		}
		if err := loadModule(name); err != nil {
			return err
		}
	}
	return s.Err()
}

// loadModule inserts one module with finit_module(2).
func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open module: %w", err)
	}
	defer f.Close()
	err = unix.FinitModule(int(f.Fd()), "", 0)
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load module %s: %w", path, err)
	}
	return nil
}

// waitFor polls until path exists or the timeout passes; devtmpfs creates
// the node as soon as the driver registers the disk.
func waitFor(path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("root device %s did not appear within %s", path, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mountRoot mounts the root file system on newRoot.
func mountRoot(a bootArgs) error {
	if err := os.MkdirAll(newRoot, 0o755); err != nil {
		return fmt.Errorf("mkdir %s: %w", newRoot, err)
	}
	var flags uintptr
	if a.ro {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount(a.root, newRoot, a.fstype, flags, ""); err != nil {
		return fmt.Errorf("mount root %s (%s): %w", a.root, a.fstype, err)
	}
	return nil
}

// switchRoot moves the early mounts into the new root, makes it the root
// of the mount namespace and executes init there. The initrd's few
// megabytes stay in memory; the harness's guests are short-lived.
func switchRoot(init string) error {
	for _, m := range []string{"/dev", "/proc", "/sys"} {
		if err := unix.Mount(m, newRoot+m, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s into new root: %w", m, err)
		}
	}
	if err := unix.Chdir(newRoot); err != nil {
		return fmt.Errorf("chdir new root: %w", err)
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move new root to /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("chdir /: %w", err)
	}
	logf("switching to %s", init)
	err := unix.Exec(init, []string{init}, os.Environ())
	return fmt.Errorf("exec %s: %w", init, err)
}

// logf writes one line to the kernel log, which the serial console shows
// with a timestamp; before /dev is mounted it falls back to stderr.
func logf(format string, args ...any) {
	line := fmt.Sprintf("latchkey-vmguest init: "+format+"\n", args...)
	if f, err := os.OpenFile("/dev/kmsg", os.O_WRONLY, 0); err == nil {
		_, _ = f.WriteString(line)
		_ = f.Close()
		return
	}
	_, _ = os.Stderr.WriteString(line)
}

// powerOff stops the VM; QEMU exits when its guest powers off.
func powerOff() {
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	// Reboot only returns on error; exiting PID 1 panics the kernel, and
	// the harness boots with panic=1 and -no-reboot, so QEMU exits anyway.
	os.Exit(1)
}
