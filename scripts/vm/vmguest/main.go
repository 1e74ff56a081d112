//go:build linux

// Command latchkey-vmguest is the end-to-end harness's helper inside the
// QEMU guest (scripts/e2e-vm.sh). It is two small tools in one static
// binary, so the guest needs nothing beyond Debian packages and this file:
//
//   - as PID 1 of the initrd it loads the virtio modules the Debian cloud
//     kernel keeps outside its image, mounts the root file system and hands
//     over to systemd, and powers the VM off on any failure so a broken
//     image ends the QEMU run instead of hanging it;
//   - in the booted guest, `latchkey-vmguest pcr-event INDEX DATA` records an
//     event into a PCR, which is how the harness simulates a tampered boot
//     component measured before the agent runs.
//
// It is a test tool: nothing in the shipped binaries imports it.
package main

import (
	"fmt"
	"os"
)

func main() {
	if os.Getpid() == 1 {
		runInit()
		return
	}
	if err := runCommand(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "latchkey-vmguest: %v\n", err)
		os.Exit(1)
	}
}

// runCommand dispatches the subcommands used inside the booted guest.
func runCommand(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: latchkey-vmguest pcr-event INDEX DATA")
	}
	switch args[0] {
	case "pcr-event":
		if len(args) != 3 {
			return fmt.Errorf("usage: latchkey-vmguest pcr-event INDEX DATA")
		}
		return pcrEvent(tpmDevice, args[1], args[2])
	default:
		return fmt.Errorf("unknown command %q", args[0])
	}
}
