package app_test

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest/tpm"
	"github.com/latchkey/latchkey/attest/tpm/issuer"
	"github.com/latchkey/latchkey/attest/tpm/offline"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/internal/benchtest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/policy"
)

// BenchmarkOfflineUnlock alternates, on one swtpm and in one run, the
// three ways a booting machine gets its disk key, one of each per op:
//
//   - rejoin: an online rejoin through the assembled verifier (TCP and
//     TLS 1.3, EK/AK and quote on swtpm, credential activation,
//     verification, policy, ticket with its offline grant, ack);
//   - offline: the agent's offline unlock of an object sealed for that
//     rejoin's real grant (decode the sealed object, open the TPM,
//     offline.Unseal, close);
//   - clevis: `clevis decrypt` of a tpm2 pin sealed to the same PCRs.
//
// Figures are medians over the ops (the machine is shared and noisy).
// offline CPU is this process's (nothing else runs in it meanwhile);
// rejoin CPU is this process's too, agent and verifier together, since
// the rig runs both: an upper bound on the agent's share. Clevis' CPU is
// its process tree (shell, jose, tpm2-tools). swtpm's CPU is in none.
//
//	go test ./verifier/app -run '^$' -bench BenchmarkOfflineUnlock -benchtime 30x
func BenchmarkOfflineUnlock(b *testing.B) {
	u := newOfflineUnlockRig(b)
	var rejoin, off, cl samples
	b.ResetTimer()
	for range b.N {
		rejoin.add(u.timeRejoin(b))
		off.add(u.timeOffline(b))
		if u.jwe != nil {
			cl.add(u.sim.ClevisDecrypt(b, u.jwe, u.key))
		}
	}
	b.StopTimer()
	rejoin.report(b, "rejoin")
	off.report(b, "offline")
	b.ReportMetric(ratio(off.wallMedian(), rejoin.wallMedian()), "offline/rejoin-wall")
	b.ReportMetric(ratio(off.cpuMedian(), rejoin.cpuMedian()), "offline/rejoin-cpu")
	if u.jwe != nil {
		cl.report(b, "clevis")
		b.ReportMetric(ratio(off.wallMedian(), cl.wallMedian()), "offline/clevis-wall")
		b.ReportMetric(ratio(off.cpuMedian(), cl.cpuMedian()), "offline/clevis-cpu")
	}
}

// offlineUnlockRig is one swtpm, joined through a verifier whose policy
// grants offline unlock, with the disk key sealed for the grant and, when
// Clevis is installed, the same key in a tpm2 pin on the same PCRs.
type offlineUnlockRig struct {
	sim    *tpmtest.Simulator
	client *ticket.Client
	req    ticket.Request
	key    []byte
	sealed []byte
	grant  *latchkeyv1.OfflineGrant
	jwe    []byte
}

func newOfflineUnlockRig(b *testing.B) *offlineUnlockRig {
	ctx := context.Background()
	sim := tpmtest.Start(b)
	ref, err := issuer.Measure(ctx, sim.Device, testPCRs)
	if err != nil {
		b.Fatal(err)
	}
	sec := policy.TPMSection{Policy: tpm.Policy{PCRs: ref.PCRs, EKCARoots: sim.EKCARootsPEM},
		OfflineUnlock: &policy.OfflineUnlock{MaxBoots: 2, MaxHours: 24}}
	_, cfg := verifierFiles(b, map[string]any{"tpm": sec}, randomSecret(), "bench")
	r := startRig(b, sim, cfg)
	u := &offlineUnlockRig{sim: sim, client: r.agent(b, r.issuer(b), time.Minute), req: worker()}
	// The first join claims the node and disk the timed ops rejoin.
	tk, err := u.client.Get(ctx, u.req)
	if err != nil {
		b.Fatalf("first join: %v\n%s", err, r.logs)
	}
	u.req.Rejoin = true
	u.key, u.grant = tk.GetDiskKey(), tk.GetOfflineGrant()
	if u.grant == nil {
		b.Fatal("the ticket carries no offline grant")
	}
	u.sealed = u.seal(b)
	u.jwe = sim.ClevisEncrypt(b, u.key, pcrIDs(testPCRs))
	return u
}

// seal seals the disk key for the grant, as the agent does after a join,
// and keeps it encoded, as the agent stores it.
func (u *offlineUnlockRig) seal(b *testing.B) []byte {
	tp, err := issuer.OpenDevice(u.sim.Device)
	if err != nil {
		b.Fatal(err)
	}
	defer tp.Close()
	s, err := offline.Seal(tp, u.key, u.grant)
	if err != nil {
		b.Fatal(err)
	}
	enc, err := s.MarshalBinary()
	if err != nil {
		b.Fatal(err)
	}
	return enc
}

func (u *offlineUnlockRig) timeRejoin(b *testing.B) (wall, cpu time.Duration) {
	cpu0, start := benchtest.SelfCPU(b), time.Now()
	tk, err := u.client.Get(context.Background(), u.req)
	wall, cpu = time.Since(start), benchtest.SelfCPU(b)-cpu0
	if err != nil || !bytes.Equal(tk.GetDiskKey(), u.key) {
		b.Fatalf("rejoin: %v", err)
	}
	return wall, cpu
}

func (u *offlineUnlockRig) timeOffline(b *testing.B) (wall, cpu time.Duration) {
	cpu0, start := benchtest.SelfCPU(b), time.Now()
	key, err := u.unseal()
	wall, cpu = time.Since(start), benchtest.SelfCPU(b)-cpu0
	if err != nil || !bytes.Equal(key, u.key) {
		b.Fatalf("offline unseal: %v", err)
	}
	return wall, cpu
}

// unseal is the agent's offline unlock (agent/app's tpmSealer.Unseal).
func (u *offlineUnlockRig) unseal() ([]byte, error) {
	var s offline.Sealed
	if err := s.UnmarshalBinary(u.sealed); err != nil {
		return nil, err
	}
	tp, err := issuer.OpenDevice(u.sim.Device)
	if err != nil {
		return nil, err
	}
	defer tp.Close()
	key, _, err := offline.Unseal(tp, &s, u.grant)
	return key, err
}

// pcrIDs is Clevis' spelling of a PCR selection: "0,7,14".
func pcrIDs(pcrs []int) string {
	var b []byte
	for i, p := range pcrs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(p), 10)
	}
	return string(b)
}

// samples are the wall and CPU times of one kind of op.
type samples struct{ wall, cpu []time.Duration }

func (s *samples) add(wall, cpu time.Duration) {
	s.wall, s.cpu = append(s.wall, wall), append(s.cpu, cpu)
}

func (s *samples) wallMedian() time.Duration { return median(s.wall) }
func (s *samples) cpuMedian() time.Duration  { return median(s.cpu) }

func (s *samples) report(b *testing.B, name string) {
	b.ReportMetric(ms(s.wallMedian()), name+"-ms/op")
	b.ReportMetric(ms(s.cpuMedian()), name+"-cpu-ms/op")
}

func median(d []time.Duration) time.Duration {
	sorted := slices.Sorted(slices.Values(d))
	return benchtest.Quantile(sorted, 0.5)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }
