package app_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest/tpm"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	adminv1 "github.com/latchkey/latchkey/proto/latchkey/admin/v1"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
)

// The finding, end to end on swtpm with Kubernetes-mode Leases: a
// re-attestation naming disk_key_generation 4294967295, from a machine
// the policy refuses and from one it admits, is refused (the verifier
// never served that generation), recorded as refused, and writes nothing
// to the disk's record; every binding listing still reads every record.
func TestReattestBadGenerationWritesNothing(t *testing.T) {
	sim := tpmtest.Start(t)
	pol := tpmPolicy(t, sim)
	r := newIDRig(t, pol, true, false)
	iss := tpmIssuer(t, sim)
	const disk = "7d3f0a2e-4c1b-4e5a-9b8c-00000000a001"
	r.join(t, iss, req("gen-node", disk, false, true))

	// The enforced policy now refuses this machine (PCR 14 unlisted).
	refusing := tpm.Policy{PCRs: map[int][]string{}, EKCARoots: sim.EKCARootsPEM}
	for k, v := range pol["tpm"].(tpm.Policy).PCRs {
		refusing.PCRs[k] = v
	}
	refusing.PCRs[14] = []string{strings.Repeat("ab", 32)}
	want := "disk " + disk + " names master-secret generation 4294967295, which is unknown to this verifier (it serves 0)"
	for _, p := range []map[string]any{{"tpm": refusing}, pol} {
		r.setPolicy(t, p, nil)
		q := req("gen-node", disk, true, false)
		q.Reattest = true
		bad := uint32(4294967295)
		q.DiskKeyGeneration = &bad
		_, err := r.agentOnce(t, iss).Get(context.Background(), q)
		var re *ticket.RefusedError
		if !errors.As(err, &re) || re.Reason != latchkeyv1.Reason_KEY_GENERATION_RETIRED || re.Detail != want {
			t.Fatalf("re-attestation naming 4294967295: %v\nwant KEY_GENERATION_RETIRED %q", err, want)
		}
		r.wantRecorded(t, "gen-node", binding.DecisionRefused, "KEY_GENERATION_RETIRED")
		rec, err := r.bindingsStore(t).Get(context.Background(), binding.Disk, disk)
		if err != nil || rec.KeyGeneration == nil || *rec.KeyGeneration != 0 {
			t.Fatalf("disk record after the refused re-attestation: %+v %v, want generation 0", rec, err)
		}
		list, err := r.admin(t).ListBindings(context.Background(), &adminv1.ListBindingsRequest{})
		if err != nil || len(list.GetSkipped()) != 0 || len(list.GetBindings()) != 2 {
			t.Fatalf("bindings list: %v %v, want both records and none skipped", list, err)
		}
	}
}
