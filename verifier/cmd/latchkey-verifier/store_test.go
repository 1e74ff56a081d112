package main

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/latchkey/latchkey/internal/etcdtest"
	"github.com/latchkey/latchkey/internal/pkitest"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/exitcode"
)

// etcdConfig writes a disk-only verifier config whose identity.etcd
// points at c with the given client certificate.
func etcdConfig(t *testing.T, c *etcdtest.Cluster, certFile, keyFile string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "verifier.yaml")
	yaml := fmt.Sprintf("policy: /nonexistent/policy.yaml\nclusterSalt: salt\nidentity:\n  etcd:\n    endpoints: [%s]\n"+
		"    caFile: %s\n    certFile: %s\n    keyFile: %s\n    prefix: /site-a/\n    requestTimeout: 2s\n",
		strings.Join(c.Endpoints(), ", "), c.CAFile, certFile, keyFile)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func etcdStore(t *testing.T, c *etcdtest.Cluster) *binding.Etcd {
	t.Helper()
	s, err := binding.NewEtcd(binding.EtcdConfig{Endpoints: c.Endpoints(), CAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile,
		Prefix: "/site-a/", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

const (
	storeIDA = "tpm-ek:sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	storeIDB = "tpm-ek:sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

func storeDisk(i int) string { return fmt.Sprintf("5a1c0de0-0000-4000-8000-%012x", i) }

// store check connects with the configured client certificate, proves
// read and write access and counts the records; a client certificate of
// another CA is refused by etcd, and an invalid record fails the check
// naming its key.
func TestStoreCheck(t *testing.T) {
	c := etcdtest.StartTLS(t, 1)
	s := etcdStore(t, c)
	ctx := context.Background()
	for i := range 3 {
		if _, err := s.Claim(ctx, binding.Disk, storeDisk(i), storeIDA); err != nil {
			t.Fatal(err)
		}
	}
	cfg := etcdConfig(t, c, c.CertFile, c.KeyFile)
	code, out, errs := runCLI(t, "store", "check", "--config", cfg)
	if code != exitcode.OK || !strings.Contains(out, "prefix /site-a/: read and write allowed, 3 records") {
		t.Fatalf("check: exit %d, %q %q", code, out, errs)
	}

	// The same name and key usage, issued by another CA.
	foreign := pkitest.Issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "latchkey-verifier"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		pkitest.NewCA(t, "latchkey etcd test CA"))
	certFile, keyFile := foreign.WriteFiles(t, t.TempDir(), "client.crt", "client.key")
	code, out, errs = runCLI(t, "store", "check", "--config", etcdConfig(t, c, certFile, keyFile))
	if code != exitcode.Failed || !strings.Contains(errs, "etcd check /site-a/check/probe") ||
		!strings.Contains(errs, "endpoint "+c.Endpoints()[0]+": tls: remote error: tls: bad certificate") {
		t.Fatalf("foreign client certificate: exit %d, %q %q", code, out, errs)
	}

	bad := s.Key(binding.Disk, storeDisk(9))
	if _, err := c.Client(t).Put(ctx, bad, `{"schema":1,"kind":"disk","name":"`+storeDisk(8)+`","identity":"`+storeIDA+`","created":"2026-01-01T00:00:00Z"}`); err != nil {
		t.Fatal(err)
	}
	code, out, errs = runCLI(t, "store", "check", "--config", cfg)
	if code != exitcode.Failed || !strings.Contains(out, "3 records") ||
		!strings.Contains(out, "invalid record "+bad+": binding: etcd record "+bad+" does not name itself") ||
		!strings.Contains(errs, "1 invalid record(s)") {
		t.Fatalf("check with a bad record: exit %d, %q %q", code, out, errs)
	}

	// Without identity.etcd there is nothing to check.
	plain := filepath.Join(t.TempDir(), "verifier.yaml")
	os.WriteFile(plain, []byte("policy: /p\nclusterSalt: s\n"), 0o600)
	if code, _, errs := runCLI(t, "store", "check", "--config", plain); code != exitcode.BadConfig || !strings.Contains(errs, "no identity.etcd") {
		t.Fatalf("no etcd configured: exit %d %q", code, errs)
	}
}

// bindings migrate copies a directory store written by today's code
// (claims, a generation, a release) into etcd; a second run changes
// nothing; a record etcd holds for another machine is a conflict, named,
// exit InUse, and left as it is.
func TestBindingsMigrateFromDir(t *testing.T) {
	c := etcdtest.StartTLS(t, 1)
	ctx := context.Background()
	from := t.TempDir()
	dir, err := binding.NewDir(binding.DirConfig{Dir: from, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if _, _, err := dir.ClaimGeneration(ctx, storeDisk(i), storeIDA, uint32(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := dir.Claim(ctx, binding.Node, "node-1", storeIDB); err != nil {
		t.Fatal(err)
	}
	if _, err := dir.Release(ctx, binding.Disk, storeDisk(3), "admin uid=0"); err != nil {
		t.Fatal(err)
	}
	want, err := dir.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := etcdConfig(t, c, c.CertFile, c.KeyFile)
	s := etcdStore(t, c)
	for run, summary := range []string{"5 records in " + from + ": 5 copied, 0 already in etcd, 0 conflicts",
		"5 records in " + from + ": 0 copied, 5 already in etcd, 0 conflicts"} {
		code, out, errs := runCLI(t, "bindings", "migrate", "--from-dir", from, "--config", cfg)
		if code != exitcode.OK || !strings.Contains(out, summary) {
			t.Fatalf("run %d: exit %d, %q %q", run, code, out, errs)
		}
		got, err := s.List(ctx)
		if err != nil || !sameRecords(got, want) {
			t.Fatalf("run %d: etcd holds %+v (%v), want %+v", run, got, err, want)
		}
	}

	// Another machine's claim in etcd on a disk the directory gives idA.
	if _, err := s.Release(ctx, binding.Disk, storeDisk(1), "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, binding.Disk, storeDisk(1), storeIDB); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(t, "bindings", "migrate", "--from-dir", from, "--config", cfg)
	key := s.Key(binding.Disk, storeDisk(1))
	if code != exitcode.InUse || !strings.Contains(out, "4 already in etcd, 1 conflicts") ||
		!strings.Contains(errs, "conflict: disk "+storeDisk(1)+": binding: etcd record "+key+" is bound to \""+storeIDB+"\"; the imported record says \""+storeIDA+"\"") {
		t.Fatalf("conflict: exit %d, %q %q", code, out, errs)
	}
	if r, err := s.Get(ctx, binding.Disk, storeDisk(1)); err != nil || r.Identity != storeIDB {
		t.Fatalf("the conflicting record changed: %+v %v", r, err)
	}
	if code, _, errs := runCLI(t, "bindings", "migrate", "--config", cfg); code != exitcode.BadConfig || !strings.Contains(errs, "usage: latchkey-verifier bindings migrate") {
		t.Fatalf("no --from-dir: exit %d %q", code, errs)
	}
}

// sameRecords compares two listings by what a record binds.
func sameRecords(a, b []binding.Record) bool {
	key := func(r binding.Record) string {
		gen := "-"
		if r.KeyGeneration != nil {
			gen = fmt.Sprint(*r.KeyGeneration)
		}
		return fmt.Sprintf("%s/%s/%s/%s/%s/%v", r.Kind, r.Name, r.Identity, gen, r.ReleasedBy, r.Created.Unix())
	}
	ka, kb := make([]string, len(a)), make([]string, len(b))
	for i := range a {
		ka[i] = key(a[i])
	}
	for i := range b {
		kb[i] = key(b[i])
	}
	slices.Sort(ka)
	slices.Sort(kb)
	return slices.Equal(ka, kb)
}

// With etcd authentication on, store check proves the permissions the
// verifier needs: a user that may only read the prefix fails on the
// write (naming etcd's refusal), one that may read and write passes.
func TestStoreCheckPermissions(t *testing.T) {
	c := etcdtest.StartTLS(t, 1)
	ctx := context.Background()
	rootCert, rootKey := c.ClientCert(t, "root")
	root := c.ClientAs(t, rootCert, rootKey)
	end := clientv3.GetPrefixRangeEnd("/site-a/")
	steps := []func() error{
		func() error {
			_, err := root.UserAddWithOptions(ctx, "root", "", &clientv3.UserAddOptions{NoPassword: true})
			return err
		},
		func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
	}
	for user, perm := range map[string]clientv3.PermissionType{"reader": clientv3.PermissionType(clientv3.PermRead), "latchkey-verifier": clientv3.PermissionType(clientv3.PermReadWrite)} {
		steps = append(steps,
			func() error { _, err := root.RoleAdd(ctx, user); return err },
			func() error { _, err := root.RoleGrantPermission(ctx, user, "/site-a/", end, perm); return err },
			func() error {
				_, err := root.UserAddWithOptions(ctx, user, "", &clientv3.UserAddOptions{NoPassword: true})
				return err
			},
			func() error { _, err := root.UserGrantRole(ctx, user, user); return err })
	}
	steps = append(steps, func() error { _, err := root.AuthEnable(ctx); return err })
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("auth setup step %d: %v", i, err)
		}
	}
	readerCert, readerKey := c.ClientCert(t, "reader")
	code, out, errs := runCLI(t, "store", "check", "--config", etcdConfig(t, c, readerCert, readerKey))
	if code != exitcode.Failed || !strings.Contains(errs, "etcd check /site-a/check/probe: write: etcdserver: permission denied") {
		t.Fatalf("read-only user: exit %d, %q %q", code, out, errs)
	}
	code, out, errs = runCLI(t, "store", "check", "--config", etcdConfig(t, c, c.CertFile, c.KeyFile))
	if code != exitcode.OK || !strings.Contains(out, "read and write allowed, 0 records") {
		t.Fatalf("read-write user: exit %d, %q %q", code, out, errs)
	}
}

// Misuse of store and bindings migrate exits BadConfig before touching
// etcd.
func TestStoreUsageErrors(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "file")
	os.WriteFile(notDir, nil, 0o600)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"store"}, "usage: latchkey-verifier store"},
		{[]string{"store", "verify"}, "usage: latchkey-verifier store"},
		{[]string{"store", "check", "extra"}, "usage: latchkey-verifier store"},
		{[]string{"store", "check", "--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"bindings", "migrate"}, "usage: latchkey-verifier bindings migrate"},
		{[]string{"bindings", "migrate", "--from-dir", notDir}, "--from-dir " + notDir + ": not a directory"},
		{[]string{"bindings", "migrate", "--from-dir", t.TempDir(), "x"}, "usage: latchkey-verifier bindings migrate"},
	} {
		if code, _, errs := runCLI(t, tc.args...); code != exitcode.BadConfig || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d %q, want %d and %q", tc.args, code, errs, exitcode.BadConfig, tc.want)
		}
	}
}
