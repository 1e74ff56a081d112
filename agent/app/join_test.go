package app

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/agent/boot"
	"github.com/latchkey/latchkey/agent/config"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

func TestDryRunPrintsRedactedJoinConfiguration(t *testing.T) {
	var out bytes.Buffer
	cfg := &config.Config{NodeName: "node-1", Role: "worker", Join: config.Join{DryRun: true}}
	j, err := newJoiner(cfg, Deps{Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	secret := "0123456789abcdef"
	ticket := &latchkeyv1.Ticket{Token: "abcdef." + secret, ApiServerEndpoints: []string{"10.0.0.1:6443"},
		CaCertHashes: []string{"sha256:" + strings.Repeat("ab", 32)}}
	if err := j.Join(context.Background(), ticket); err != nil {
		t.Fatal(err)
	}
	y := out.String()
	for _, want := range []string{"kind: JoinConfiguration", "abcdef.", "10.0.0.1:6443", "sha256:abab", "name: node-1"} {
		if !strings.Contains(y, want) {
			t.Errorf("dry-run output lacks %q:\n%s", want, y)
		}
	}
	if strings.Contains(y, secret) {
		t.Fatalf("dry-run output carries the token secret:\n%s", y)
	}
}

// TestDryRunIsOneAttempt: printing the configuration is not retried with
// fresh tickets, kubeadm is.
func TestDryRunIsOneAttempt(t *testing.T) {
	if n := joinAttempts(&config.Config{Join: config.Join{DryRun: true}}); n != 1 {
		t.Fatalf("dry run: %d attempts, want 1", n)
	}
	if n := joinAttempts(&config.Config{}); n != boot.DefaultJoinAttempts {
		t.Fatalf("kubeadm join: %d attempts, want %d", n, boot.DefaultJoinAttempts)
	}
}

func TestJoinDisabledIsNoJoiner(t *testing.T) {
	j, err := newJoiner(&config.Config{Join: config.Join{Disabled: true}}, Deps{})
	if err != nil || j != nil {
		t.Fatalf("joiner %v err %v, want none", j, err)
	}
}

func TestMeasureMarksMachineSpecificValues(t *testing.T) {
	in := "apiVersion: latchkey/v1\ntpm:\n  ekPublicKeyHashes:\n  - sha256:ab\n  pcrs:\n    \"7\":\n    - cd\n"
	out := string(markMachineSpecific([]byte(in)))
	want := "  # machine-specific: this machine's EK only: for a fleet, trust the EK CA (ekCARoots) instead\n  ekPublicKeyHashes:\n"
	if !strings.Contains(out, want) || strings.Count(out, "machine-specific") != 1 {
		t.Fatalf("marked:\n%s", out)
	}
	if strings.ReplaceAll(out, want, "  ekPublicKeyHashes:\n") != in {
		t.Fatal("marking changed more than the comment")
	}
}
