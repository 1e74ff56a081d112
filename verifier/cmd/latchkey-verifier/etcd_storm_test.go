package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/attest/snp/snptest"
	"github.com/latchkey/latchkey/attest/tpm"
	tpmissuer "github.com/latchkey/latchkey/attest/tpm/issuer"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/internal/etcdtest"
	"github.com/latchkey/latchkey/internal/yamltest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
)

// loggedReplica is one verifier process whose stderr (its audit lines)
// is kept in a file, so the lines of a replica that was killed still
// count.
type loggedReplica struct {
	cmd  *exec.Cmd
	addr string
	log  string
	done chan struct{}
	// profile is where the process writes its CPU profile on SIGUSR1
	// (profile_test.go), or "".
	profile string
}

// startLoggedReplica runs `latchkey-verifier serve --config cfg` and
// waits for its serving line.
func startLoggedReplica(t testing.TB, cfg, logPath string) *loggedReplica {
	t.Helper()
	cmd := exec.Command(os.Args[0], "serve", "--config", cfg)
	cmd.Env = append(os.Environ(), "LATCHKEY_VERIFIER_TEST_MAIN=1")
	r := &loggedReplica{cmd: cmd, log: logPath, done: make(chan struct{})}
	if dir := os.Getenv("LATCHKEY_ETCD_BENCH_PROFILE"); dir != "" {
		r.profile = filepath.Join(dir, filepath.Base(filepath.Dir(logPath))+".pprof")
		cmd.Env = append(cmd.Env, profileEnv+"="+r.profile)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	serving := make(chan string, 1)
	go func() {
		defer close(r.done)
		defer f.Close()
		lines := bufio.NewScanner(stderr)
		lines.Buffer(make([]byte, 64<<10), 1<<20)
		for lines.Scan() {
			fmt.Fprintln(f, lines.Text())
			if m := servingRE.FindStringSubmatch(lines.Text()); m != nil {
				serving <- m[1]
			}
		}
		_, _ = io.Copy(f, stderr)
	}()
	t.Cleanup(r.kill)
	select {
	case r.addr = <-serving:
	case <-r.done:
		t.Fatalf("replica %s exited before serving", cfg)
	case <-time.After(30 * time.Second):
		r.kill()
		t.Fatalf("replica %s never served", cfg)
	}
	return r
}

// kill ends the process with SIGKILL (only the one this test started)
// and waits until its log is written out.
func (r *loggedReplica) kill() {
	if r.cmd.ProcessState == nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
	}
	<-r.done
}

// cpu is the process's user+system CPU time so far.
func cpuOf(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ 100
}

// etcdFleet is a three-member TLS etcd, replicas on it and the agents'
// trust: everything a storm needs but the agents.
type etcdFleet struct {
	etcd     *etcdtest.Cluster
	dir      string
	policy   string
	secret   string
	ca       *replicaCA
	pin      atls.Pin
	replicas []*loggedReplica
	// failed counts the join attempts that failed or were turned away
	// (a refusal, admission control's retry-after hint, a dead replica).
	failed atomic.Int64
}

// newEtcdFleet starts the etcd cluster (members) and writes the shared
// files; pol is the policy document.
func newEtcdFleet(t testing.TB, members int, pol map[string]any) *etcdFleet {
	t.Helper()
	f := &etcdFleet{etcd: etcdtest.StartTLS(t, members), dir: t.TempDir(), ca: newReplicaCA(t)}
	f.pin = atls.PinOf(f.ca.cert)
	pol["apiVersion"] = "latchkey/v1"
	f.policy = yamltest.Write(t, filepath.Join(f.dir, "policy.yaml"), pol)
	f.secret = filepath.Join(f.dir, "master")
	if err := os.WriteFile(f.secret, []byte(strings.Repeat("s", 32)), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// startReplicas starts n verifier processes, on etcd (identity.etcd) or
// each on its own directory store.
func (f *etcdFleet) startReplicas(t testing.TB, n int, onEtcd bool) []*loggedReplica {
	t.Helper()
	var out []*loggedReplica
	for i := range n {
		rdir := filepath.Join(f.dir, fmt.Sprintf("r%d-%d", len(f.replicas), i))
		if err := os.Mkdir(rdir, 0o700); err != nil {
			t.Fatal(err)
		}
		certFile, keyFile := f.ca.issue(t, rdir, i)
		cfg := map[string]any{"listen": "127.0.0.1:0", "policy": f.policy, "masterSecretFile": f.secret, "clusterSalt": "storm",
			"stateDir": rdir, "tlsCert": certFile, "tlsKey": keyFile, "adminSocket": "-",
			"limits": map[string]any{"maxConnectionsPerSource": 4096}}
		if onEtcd {
			c := f.etcd
			cfg["identity"] = map[string]any{"etcd": map[string]any{"endpoints": c.Endpoints(), "caFile": c.CAFile,
				"certFile": c.CertFile, "keyFile": c.KeyFile, "requestTimeout": "2s"}}
		}
		r := startLoggedReplica(t, yamltest.Write(t, filepath.Join(rdir, "verifier.yaml"), cfg), filepath.Join(rdir, "stderr.log"))
		out = append(out, r)
	}
	f.replicas = append(f.replicas, out...)
	return out
}

// stormAgent is one machine: its issuer and the disk it asks for.
type stormAgent struct {
	iss  attest.Issuer
	id   string // the machine identity the verifier binds
	disk string
	// racer: another agent asks for the same disk (exactly one wins).
	racer bool
}

func stormDisk(i int) string { return fmt.Sprintf("e7cd0000-0000-4000-8000-%012x", i) }

// snpChip is the 64-byte CHIP_ID of SNP agent i.
func snpChip(i int) []byte {
	chip := make([]byte, 64)
	chip[0] = 0xc5
	binary.BigEndian.PutUint32(chip[1:], uint32(i))
	return chip
}

// snpAgents are n SEV-SNP test-signer machines on their own disks, and
// racers more machines each asking for the disk of an agent before it.
func snpAgents(t testing.TB, n, racers int) []*stormAgent {
	t.Helper()
	var out []*stormAgent
	for i := range n + racers {
		a := snpAgent(t, i)
		if i >= n {
			victim := out[(i-n)*n/max(racers, 1)]
			a.disk, a.racer, victim.racer = victim.disk, true, true
		}
		out = append(out, a)
	}
	return out
}

// snpAgent is SEV-SNP machine i (its own chip) on disk i.
func snpAgent(t testing.TB, i int) *stormAgent {
	s := snptest.NewWithOptions(t, snptest.Options{ChipID: snpChip(i)})
	return &stormAgent{iss: s.Issuer(), id: "snp-chip:" + hex.EncodeToString(snpChip(i)), disk: stormDisk(i)}
}

// join runs one agent's join through endpoints, retrying and failing
// over until timeout; a refusal no retry can change (IDENTITY_MISMATCH)
// ends it at once and is returned.
func (f *etcdFleet) join(a *stormAgent, endpoints []string, rejoin bool, timeout time.Duration) (*latchkeyv1.Ticket, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var final error
	c, err := ticket.New(ticket.Config{Endpoints: endpoints, Pins: []atls.Pin{f.pin}, Issuer: a.iss, Timeout: timeout,
		AttemptTimeout: 20 * time.Second, InitialBackoff: 50 * time.Millisecond, MaxBackoff: time.Second, Logger: quiet(),
		OnBusy: func(time.Duration) { f.failed.Add(1) },
		OnAttemptFailed: func(err error) {
			f.failed.Add(1)
			var re *ticket.RefusedError
			if errors.As(err, &re) && !re.Transient() {
				final = err
				cancel()
			}
		}})
	if err != nil {
		return nil, err
	}
	tk, err := c.Get(ctx, ticket.Request{NodeName: "node-" + a.disk[len(a.disk)-6:], DiskUUID: a.disk,
		Role: latchkeyv1.Role_ROLE_WORKER, Rejoin: rejoin})
	if err != nil && final != nil {
		return nil, final
	}
	return tk, err
}

// joinOnce is one attempt through one endpoint: the refusal as it is.
func (f *etcdFleet) joinOnce(a *stormAgent, endpoint string, rejoin bool) error {
	c, err := ticket.New(ticket.Config{Endpoints: []string{endpoint}, Pins: []atls.Pin{f.pin}, Issuer: a.iss, Timeout: time.Minute,
		Sleep: func(context.Context, time.Duration) error { return context.Canceled }, Logger: quiet()})
	if err != nil {
		return err
	}
	_, err = c.Get(context.Background(), ticket.Request{NodeName: "node-x", DiskUUID: a.disk,
		Role: latchkeyv1.Role_ROLE_WORKER, Rejoin: rejoin})
	return err
}

func (f *etcdFleet) endpoints(rs []*loggedReplica) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.addr)
	}
	return out
}

// etcdBindings reads every record under the replicas' prefix: disk UUID
// to identity, and the store's revision.
func etcdBindings(t testing.TB, cli *clientv3.Client) (map[string]string, int64) {
	t.Helper()
	resp, err := cli.Get(context.Background(), binding.DefaultEtcdPrefix+"bindings/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		var r struct{ Kind, Name, Identity string }
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			t.Fatalf("record %s: %v", kv.Key, err)
		}
		if _, dup := out[r.Name]; dup || r.Kind != "disk" {
			t.Fatalf("record %s: %s %s seen twice or not a disk", kv.Key, r.Kind, r.Name)
		}
		out[r.Name] = r.Identity
	}
	return out, resp.Header.Revision
}

var (
	acceptedRE = regexp.MustCompile(`msg="join decision" .*disk_uuid=(\S+) .*result=accepted .*identity=(\S+)`)
)

// auditBindings reads the accepted joins of every replica's log: disk
// UUID to the identity accepted for it (a disk accepted for two
// identities fails the test).
func auditBindings(t testing.TB, rs []*loggedReplica) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, r := range rs {
		data, err := os.ReadFile(r.log)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			m := acceptedRE.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			if had, ok := out[m[1]]; ok && had != m[2] {
				t.Fatalf("disk %s accepted for %s and %s", m[1], had, m[2])
			}
			out[m[1]] = m[2]
		}
	}
	return out
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// A boot storm through three disk-only replicas on a three-member etcd:
// several hundred SEV-SNP test-signer machines and a few swtpm ones join
// at once, some pairs of different machines racing for one disk UUID,
// and one etcd member and one verifier are killed (SIGKILL) mid-storm.
// Every disk ends up bound to exactly one identity, every machine that
// should get its key gets it, etcd holds exactly what the replicas'
// audit lines accepted with one write per record, and rejoins write
// nothing. Then a claim left by a verifier that died before its ticket is
// completed by its machine and refused to another, and with two members
// down joins are refused UNAVAILABLE with the documented detail until a
// member returns. LATCHKEY_ETCD_STORM_AGENTS sets the SNP agent count.
func TestEtcdReplicasStorm(t *testing.T) {
	n := envInt("LATCHKEY_ETCD_STORM_AGENTS", 300)
	racers := max(n/20, 1)
	sims := tpmtest.StartSiblings(t, 3)
	pcrs := []int{0, 7}
	ref, err := tpmissuer.Measure(context.Background(), sims[0].Device, pcrs)
	if err != nil {
		t.Fatal(err)
	}
	agents := snpAgents(t, n, racers)
	f := newEtcdFleet(t, 3, map[string]any{"snp": snptest.New(t).Policy(), "tpm": tpm.Policy{PCRs: ref.PCRs, EKCARoots: sims[0].EKCARootsPEM}})
	for i, sim := range sims {
		iss, err := tpmissuer.New(tpmissuer.Config{Device: sim.Device, PCRs: pcrs})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { iss.Close() })
		agents = append(agents, &stormAgent{iss: iss, disk: stormDisk(100000 + i)})
	}
	cli := f.etcd.Client(t)
	_, rev0 := etcdBindings(t, cli)
	rs := f.startReplicas(t, 3, true)
	eps := f.endpoints(rs)

	var accepted atomic.Int64
	var killOnce sync.Once
	killAt := int64(len(agents) / 3)
	keys := make([][]byte, len(agents))
	errs := make([]error, len(agents))
	var wg sync.WaitGroup
	start := time.Now()
	for i, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk, err := f.join(a, eps, false, 3*time.Minute)
			errs[i] = err
			if err == nil {
				keys[i] = tk.DiskKey
				if accepted.Add(1) == killAt {
					killOnce.Do(func() { f.etcd.Members[0].Kill(); rs[0].kill() })
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d agents (%d racing) joined through 3 replicas in %v", len(agents), racers, time.Since(start))
	if killAt > accepted.Load() {
		t.Fatalf("only %d joins succeeded; nothing was killed", accepted.Load())
	}

	// Every machine got its key except exactly one of each racing pair,
	// which was refused IDENTITY_MISMATCH.
	winners := map[string]string{}
	for i, a := range agents {
		var re *ticket.RefusedError
		switch {
		case errs[i] == nil && len(keys[i]) == 32:
			if w, ok := winners[a.disk]; ok {
				t.Fatalf("disk %s: two machines got its key (%s and agent %d)", a.disk, w, i)
			}
			winners[a.disk] = fmt.Sprint(i)
		case a.racer && errors.As(errs[i], &re) && re.Reason == latchkeyv1.Reason_IDENTITY_MISMATCH:
		default:
			t.Fatalf("agent %d (disk %s, racer %v): %v", i, a.disk, a.racer, errs[i])
		}
	}
	if len(winners) != len(agents)-racers {
		t.Fatalf("%d disks have a key holder, want %d", len(winners), len(agents)-racers)
	}

	// etcd holds exactly what the audit lines accepted, one write each.
	inEtcd, rev1 := etcdBindings(t, cli)
	audited := auditBindings(t, rs)
	if len(inEtcd) != len(winners) || len(audited) != len(inEtcd) {
		t.Fatalf("%d records in etcd, %d disks accepted in the audit lines, %d key holders", len(inEtcd), len(audited), len(winners))
	}
	for disk, id := range inEtcd {
		if audited[disk] != id {
			t.Fatalf("disk %s: etcd says %s, the audit lines %q", disk, id, audited[disk])
		}
	}
	for i, a := range agents {
		if a.id != "" && errs[i] == nil && inEtcd[a.disk] != a.id {
			t.Fatalf("disk %s bound to %s, but agent %d (%s) got its key", a.disk, inEtcd[a.disk], i, a.id)
		}
	}
	if writes := rev1 - rev0; writes != int64(len(inEtcd)) {
		t.Fatalf("%d etcd writes for %d first joins", writes, len(inEtcd))
	}

	// Rejoins (through the surviving replicas) write nothing.
	live := eps[1:]
	var holders []*stormAgent
	for i, a := range agents {
		if errs[i] == nil {
			holders = append(holders, a)
		}
	}
	for _, a := range holders[:10] {
		if _, err := f.join(a, live, true, time.Minute); err != nil {
			t.Fatalf("rejoin of %s: %v", a.disk, err)
		}
	}
	if _, rev2 := etcdBindings(t, cli); rev2 != rev1 {
		t.Fatalf("10 rejoins wrote %d times", rev2-rev1)
	}

	// A verifier killed between its claim and the ticket leaves the claim:
	// its machine completes the join, another machine is refused.
	f.etcd.Members[0].Start(t)
	f.etcd.WaitReady(t, f.etcd.Members[0])
	owner, other := snpAgent(t, n+racers), snpAgent(t, n+racers+1)
	store, err := binding.NewEtcd(binding.EtcdConfig{Endpoints: f.etcd.Endpoints(), CAFile: f.etcd.CAFile, CertFile: f.etcd.CertFile,
		KeyFile: f.etcd.KeyFile, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if _, err := store.Claim(context.Background(), binding.Disk, owner.disk, owner.id); err != nil {
		t.Fatal(err)
	}
	other.disk = owner.disk
	var re *ticket.RefusedError
	if err := f.joinOnce(other, live[0], false); !errors.As(err, &re) || re.Reason != latchkeyv1.Reason_IDENTITY_MISMATCH {
		t.Fatalf("another machine on an orphaned claim: %v", err)
	}
	if _, err := f.join(owner, live, false, time.Minute); err != nil {
		t.Fatalf("the owner completing its orphaned claim: %v", err)
	}

	// Two members down: first joins and rejoins are refused with the
	// documented reason and detail; one member back, they succeed.
	f.etcd.Members[1].Kill()
	f.etcd.Members[2].Kill()
	late := snpAgent(t, n+racers+2)
	for _, tc := range []struct {
		a      *stormAgent
		rejoin bool
	}{{late, false}, {holders[0], true}} {
		err := f.joinOnce(tc.a, live[0], tc.rejoin)
		if !errors.As(err, &re) || re.Reason != latchkeyv1.Reason_UNAVAILABLE || re.Detail != binding.EtcdUnavailableDetail {
			t.Fatalf("join (rejoin %v) without quorum: %v", tc.rejoin, err)
		}
	}
	f.etcd.Members[1].Start(t)
	f.etcd.WaitReady(t, f.etcd.Members[1])
	if _, err := f.join(late, live, false, time.Minute); err != nil {
		t.Fatalf("first join after the quorum returned: %v", err)
	}
}
