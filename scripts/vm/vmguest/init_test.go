//go:build linux

package main

import "testing"

func TestParseBootArgs(t *testing.T) {
	cases := []struct {
		cmdline string
		want    bootArgs
	}{
		{"console=ttyS0", bootArgs{root: "/dev/vda", fstype: "ext4", init: "/sbin/init"}},
		{"root=/dev/vdc rootfstype=xfs init=/bin/sh ro quiet",
			bootArgs{root: "/dev/vdc", fstype: "xfs", init: "/bin/sh", ro: true}},
		{"ro rw root=/dev/vda", bootArgs{root: "/dev/vda", fstype: "ext4", init: "/sbin/init"}},
	}
	for _, c := range cases {
		if got := parseBootArgs(c.cmdline); got != c.want {
			t.Errorf("parseBootArgs(%q) = %+v, want %+v", c.cmdline, got, c.want)
		}
	}
}

func TestRunCommandRejectsBadInput(t *testing.T) {
	cases := [][]string{
		nil,
		{"nope"},
		{"pcr-event", "9"},
		{"pcr-event", "16", "x"},
		{"pcr-event", "-1", "x"},
		{"pcr-event", "nine", "x"},
		{"pcr-event", "9", ""},
	}
	for _, args := range cases {
		if err := runCommand(args); err == nil {
			t.Errorf("runCommand(%q) = nil, want an error", args)
		}
	}
}
