package main

import (
	"bytes"
	"testing"

	adminv1 "github.com/latchkey/latchkey/proto/latchkey/admin/v1"
	"github.com/latchkey/latchkey/verifier/exitcode"
)

func gen32(n uint32) *uint32 { return &n }

// The retire verdict on a listing, without a verifier: disks that name
// the generation or record none block it, released ones included,
// listed by UUID; a node record, whatever it holds, and a disk on
// another generation do not.
func TestRetireVerdictListsBlockers(t *testing.T) {
	const idA = "tpm-ek:sha256:aa"
	resp := &adminv1.ListBindingsResponse{Bindings: []*adminv1.Binding{
		{Kind: adminv1.BindingKind_BINDING_KIND_DISK, Name: "d3", Identity: idA, KeyGeneration: gen32(2)},
		{Kind: adminv1.BindingKind_BINDING_KIND_NODE, Name: "node-1", Identity: idA},
		{Kind: adminv1.BindingKind_BINDING_KIND_DISK, Name: "d2", Identity: idA},
		{Kind: adminv1.BindingKind_BINDING_KIND_DISK, Name: "d1", KeyGeneration: gen32(1), ReleasedUnix: 1700000000, ReleasedBy: "uid=0 pid=7"},
		{Kind: adminv1.BindingKind_BINDING_KIND_DISK, Name: "d4", Identity: idA, KeyGeneration: gen32(1)},
	}}
	var out, errs bytes.Buffer
	if code := retireVerdict(resp, 1, &out, &errs); code != exitcode.InUse {
		t.Fatalf("exit %d, want %d (in use); stderr %s", code, exitcode.InUse, errs.String())
	}
	want := "latchkey-verifier secret retire: 3 of 4 disk records still name generation 1 or record none; not retiring it. " +
		"Each disk moves to the current generation at its next boot (and is recorded so at the one after):\n" +
		"DISK  GENERATION  IDENTITY\n" +
		"d1    1           released by uid=0 pid=7\n" +
		"d2    unknown     tpm-ek:sha256:aa\n" +
		"d4    1           tpm-ek:sha256:aa\n"
	if errs.String() != want || out.Len() != 0 {
		t.Fatalf("stderr\n%s\nwant\n%s\nstdout %q", errs.String(), want, out.String())
	}

	// Once every disk names another generation, generation 1 may go.
	resp.Bindings = []*adminv1.Binding{resp.Bindings[0], resp.Bindings[1]}
	out.Reset()
	errs.Reset()
	if code := retireVerdict(resp, 1, &out, &errs); code != exitcode.OK || errs.Len() != 0 {
		t.Fatalf("exit %d, stderr %q", code, errs.String())
	}
	if want := "no disk record (of 1) names generation 1 or lacks a generation: remove generation 1 from masterSecrets on every replica and restart them\n"; out.String() != want {
		t.Fatalf("stdout %q, want %q", out.String(), want)
	}
}

// A listing that left a record out refuses, naming it, even when every
// record it did read would allow the retirement: the unread one could be
// a disk still on the generation.
func TestRetireVerdictRefusesSkipped(t *testing.T) {
	resp := &adminv1.ListBindingsResponse{
		Bindings: []*adminv1.Binding{{Kind: adminv1.BindingKind_BINDING_KIND_DISK, Name: "d1", KeyGeneration: gen32(2)}},
		Skipped:  []*adminv1.SkippedRecord{{Key: "disk-x", Reason: "binding: lease latchkey-system/disk-x is not a latchkey binding record"}},
	}
	var out, errs bytes.Buffer
	if code := retireVerdict(resp, 1, &out, &errs); code != exitcode.InUse {
		t.Fatalf("exit %d, want %d (in use)", code, exitcode.InUse)
	}
	want := "latchkey-verifier secret retire: 1 binding record(s) cannot be read; not retiring generation 1 while any is unreadable, " +
		"since one could be a disk that still needs it. Repair or delete them, then retry:\n" +
		"  disk-x: binding: lease latchkey-system/disk-x is not a latchkey binding record\n"
	if errs.String() != want || out.Len() != 0 {
		t.Fatalf("stderr\n%s\nwant\n%s", errs.String(), want)
	}
}
