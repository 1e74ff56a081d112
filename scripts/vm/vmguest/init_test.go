//go:build linux

package main

import (
	"strings"
	"testing"
)

var defaultVerity = verityArgs{hashAlgorithm: "sha256", salt: "-", dataBlockSize: 4096, hashBlockSize: 4096, onCorruption: "panic"}

func TestParseBootArgs(t *testing.T) {
	rootHash := strings.Repeat("ab", 32)
	verity := defaultVerity
	verity.rootHash, verity.dataDevice, verity.hashDevice = rootHash, "/dev/vda2", "/dev/vda3"
	verity.salt, verity.dataBlocks, verity.hashOffset = "0011", 1000, 8192
	cases := []struct {
		cmdline string
		want    bootArgs
	}{
		{"console=ttyS0", bootArgs{root: "/dev/vda", fstype: "ext4", init: "/sbin/init", verity: defaultVerity}},
		{"root=/dev/vdc rootfstype=xfs init=/bin/sh ro quiet",
			bootArgs{root: "/dev/vdc", fstype: "xfs", init: "/bin/sh", ro: true, verity: defaultVerity}},
		{"ro rw root=/dev/vda", bootArgs{root: "/dev/vda", fstype: "ext4", init: "/sbin/init", verity: defaultVerity}},
		{"ro roothash=" + rootHash + " systemd.verity_root_data=/dev/vda2 systemd.verity_root_hash=/dev/vda3 " +
			"systemd.verity_root_options=superblock=false,data-blocks=1000,hash-offset=8192,salt=0011,panic-on-corruption",
			bootArgs{root: "/dev/vda", fstype: "ext4", init: "/sbin/init", ro: true, verity: verity}},
	}
	for _, c := range cases {
		got, err := parseBootArgs(c.cmdline)
		if err != nil || got != c.want {
			t.Errorf("parseBootArgs(%q) = %+v, %v; want %+v", c.cmdline, got, err, c.want)
		}
	}
}

func TestParseBootArgsRefusesUnsafeVerityOptions(t *testing.T) {
	cases := map[string]string{
		"systemd.verity_root_options=ignore-corruption": "would boot a corrupted root",
		"systemd.verity_root_options=superblock=true":   "only superblock=false",
		"systemd.verity_root_options=fec-device=/dev/x": "unknown verity option",
		"systemd.verity_root_options=data-blocks=ten":   "data-blocks=ten",
	}
	for cmdline, want := range cases {
		_, err := parseBootArgs(cmdline)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseBootArgs(%q) = %v, want an error containing %q", cmdline, err, want)
		}
	}
}

func TestVerityValidate(t *testing.T) {
	good := defaultVerity
	good.rootHash, good.dataDevice, good.hashDevice, good.dataBlocks = strings.Repeat("0f", 32), "/dev/vda2", "/dev/vda3", 10
	if err := good.validate(); err != nil {
		t.Fatalf("validate(good) = %v", err)
	}
	tbl := good.table()
	if tbl.Length != 40960 || tbl.HashStartBlock != 0 || len(tbl.Params) != 2 || tbl.Params[1] != "panic_on_corruption" {
		t.Errorf("table = %+v: want 40960 bytes, hash start 0, panic_on_corruption", tbl)
	}
	cases := map[string]func(v *verityArgs){
		"not hex":                  func(v *verityArgs) { v.rootHash = "zz" },
		"sha256 needs 32":          func(v *verityArgs) { v.rootHash = "00" },
		"salt":                     func(v *verityArgs) { v.salt = "xyz" },
		"systemd.verity_root_hash": func(v *verityArgs) { v.hashDevice = "" },
		"block size 1000":          func(v *verityArgs) { v.dataBlockSize = 1000 },
		"data-blocks missing":      func(v *verityArgs) { v.dataBlocks = 0 },
		"not a multiple":           func(v *verityArgs) { v.hashOffset = 100 },
	}
	for want, mutate := range cases {
		v := good
		mutate(&v)
		if err := v.validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("validate(%s) = %v, want an error containing %q", want, err, want)
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
