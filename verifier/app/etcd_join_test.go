package app_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/snp/snptest"
	"github.com/latchkey/latchkey/internal/etcdtest"
	"github.com/latchkey/latchkey/internal/logtest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/app"
	"github.com/latchkey/latchkey/verifier/binding"
)

// etcdReplicas starts n disk-only verifiers on one policy and master
// secret whose binding records live in the etcd cluster c
// (identity.etcd, opened by the configuration as serve does).
func etcdReplicas(t *testing.T, c *etcdtest.Cluster, pol map[string]any, n int) []*rig {
	t.Helper()
	dir, base := verifierFiles(t, pol, randomSecret(), "test-cluster")
	base.Identity = app.Identity{Etcd: &app.Etcd{Endpoints: c.Endpoints(), CAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile,
		RequestTimeout: app.Duration{Duration: 2 * time.Second}}}
	var out []*rig
	for i := range n {
		cfg := *base
		id := *base.Identity.Etcd
		cfg.Identity.Etcd = &id
		cfg.StateDir = filepath.Join(dir, "state", string(rune('a'+i)))
		r := &rig{logs: &logtest.Buffer{}}
		startAssembled(t, r, &cfg, nil)
		out = append(out, r)
	}
	return out
}

// joinVia runs one join through r with an agent that tries once.
func joinVia(t *testing.T, r *rig, iss attest.Issuer, q ticket.Request) (*latchkeyv1.Ticket, error) {
	t.Helper()
	return r.agentOnce(t, iss).Get(context.Background(), q)
}

// Two replicas share the etcd store: a disk claimed through one is
// refused to another machine through the other (IDENTITY_MISMATCH), and
// its owner rejoins through either. With two of three etcd members down
// a first join and a rejoin are refused UNAVAILABLE with the store's
// fixed detail (no decision on the surviving member's stale copy); once
// a member returns both succeed.
func TestEtcdReplicasShareBindings(t *testing.T) {
	c := etcdtest.StartTLS(t, 3)
	vm1 := snptest.New(t)
	vm2 := snptest.NewWithOptions(t, snptest.Options{ChipID: bytes.Repeat([]byte{0x42}, 64)})
	vm3 := snptest.NewWithOptions(t, snptest.Options{ChipID: bytes.Repeat([]byte{0x43}, 64)})
	rs := etcdReplicas(t, c, map[string]any{"snp": vm1.Policy()}, 2)

	first, err := joinVia(t, rs[0], vm1.Issuer(), req("node-1", diskA, false, false))
	if err != nil {
		t.Fatalf("first join: %v\n%s", err, rs[0].logs)
	}
	_, err = joinVia(t, rs[1], vm2.Issuer(), req("node-2", diskA, false, false))
	var re *ticket.RefusedError
	if !errors.As(err, &re) || re.Reason != latchkeyv1.Reason_IDENTITY_MISMATCH || !strings.Contains(re.Detail, "disk "+diskA+" is bound to another machine") {
		t.Fatalf("another machine through the other replica: %v", err)
	}
	again, err := joinVia(t, rs[1], vm1.Issuer(), req("node-1", diskA, true, false))
	if err != nil || !bytes.Equal(again.DiskKey, first.DiskKey) {
		t.Fatalf("rejoin through the other replica: %v", err)
	}

	c.Members[0].Kill()
	c.Members[1].Kill()
	for _, tc := range []struct {
		what string
		iss  attest.Issuer
		q    ticket.Request
	}{
		{"first join", vm3.Issuer(), req("node-3", diskB, false, false)},
		{"rejoin", vm1.Issuer(), req("node-1", diskA, true, false)},
	} {
		_, err := joinVia(t, rs[0], tc.iss, tc.q)
		if !errors.As(err, &re) || re.Reason != latchkeyv1.Reason_UNAVAILABLE || re.Detail != binding.EtcdUnavailableDetail {
			t.Fatalf("%s without quorum: %v", tc.what, err)
		}
	}
	if !strings.Contains(rs[0].logs.String(), "result=failed reason=UNAVAILABLE") {
		t.Fatalf("audit lacks the refusal:\n%s", rs[0].logs)
	}

	c.Members[1].Start(t)
	c.WaitReady(t, c.Members[1])
	if _, err := joinVia(t, rs[0], vm3.Issuer(), req("node-3", diskB, false, false)); err != nil {
		t.Fatalf("first join after the quorum returned: %v", err)
	}
	if _, err := joinVia(t, rs[1], vm1.Issuer(), req("node-1", diskA, true, false)); err != nil {
		t.Fatalf("rejoin after the quorum returned: %v", err)
	}
}

// A client certificate that cannot be read is a configuration error
// (exit 2, no restart loop), naming identity.etcd and the file.
func TestEtcdUnreadableCertificateIsConfigError(t *testing.T) {
	_, cfg := verifierFiles(t, map[string]any{"snp": snptest.New(t).Policy()}, randomSecret(), "test-cluster")
	missing := filepath.Join(t.TempDir(), "etcd.crt")
	cfg.Identity = app.Identity{Etcd: &app.Etcd{Endpoints: []string{"https://127.0.0.1:2379"}, CAFile: missing, CertFile: missing, KeyFile: missing}}
	_, err := app.New(cfg, app.Deps{Logger: slog.New(slog.DiscardHandler)})
	if !errors.Is(err, app.ErrConfig) || !strings.Contains(err.Error(), "identity.etcd: binding: etcd client TLS: ") || !strings.Contains(err.Error(), missing) {
		t.Fatalf("err = %v", err)
	}
}
