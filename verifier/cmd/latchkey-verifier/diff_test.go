package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/verifier/binding"
)

func TestPolicyDiffTable(t *testing.T) {
	now := time.Date(2026, 12, 1, 11, 0, 0, 0, time.UTC)
	sts := []binding.NodeStatus{
		{Node: "same", Last: &binding.Attestation{Time: now.Add(-time.Minute), Decision: "attested", Reason: "NONE", ShadowDecision: "accepted", ShadowReason: "NONE"}},
		{Node: "would-refuse", Last: &binding.Attestation{Time: now.Add(-2 * time.Minute), Decision: "attested", Reason: "NONE", ShadowDecision: "refused", ShadowReason: "PCR_MISMATCH"}},
		{Node: "no-candidate", Last: &binding.Attestation{Time: now, Decision: "attested", Reason: "NONE"}},
		{Node: "silent"},
	}
	var out bytes.Buffer
	if code := writeDiff(&out, sts, false, now); code != 1 {
		t.Fatalf("exit %d, want 1 (a node the candidate refuses)", code)
	}
	got := out.String()
	for _, want := range []string{
		"would-refuse  accepted  NONE    refused    PCR_MISMATCH",
		"same          accepted  NONE    accepted   NONE",
		"no-candidate  accepted  NONE    -          -",
		"silent        -         -       -          -                 never re-attested",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	out.Reset()
	if code := writeDiff(&out, sts, true, now); code != 1 || strings.Count(out.String(), "\n") != 2 || !strings.Contains(out.String(), "would-refuse") {
		t.Fatalf("--changed: exit %d\n%s", code, out.String())
	}
	out.Reset()
	if code := writeDiff(&out, sts[:1], false, now); code != 0 {
		t.Fatalf("no difference: exit %d", code)
	}
}
