package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest/atls"
	tpmissuer "github.com/latchkey/latchkey/attest/tpm/issuer"
	"github.com/latchkey/latchkey/internal/yamltest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// rssCeiling is what the verifier process may grow to under the floods
// below. Idle it holds about 35 MB; before the header limit, 50 streams of
// 8 MiB headers took it to 488 MB.
const rssCeiling = 150 << 20

func rssOf(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// floodRig is one verifier process (disk-only, TPM policy) and a TPM
// whose joins must keep succeeding through every flood.
type floodRig struct {
	rep *replica
	pin atls.Pin
	iss *tpmissuer.Issuer
}

func newFloodRig(t *testing.T, perSource int) *floodRig {
	t.Helper()
	rig := newTPMRig(t)
	dir := rig.dir
	os.WriteFile(filepath.Join(dir, "master"), bytes.Repeat([]byte{3}, 32), 0o600)
	ca := newReplicaCA(t)
	certFile, keyFile := ca.issue(t, dir, 0)
	cfg := yamltest.Write(t, filepath.Join(dir, "verifier.yaml"), map[string]any{"listen": "127.0.0.1:0", "policy": rig.policy,
		"masterSecretFile": filepath.Join(dir, "master"), "clusterSalt": "flood", "stateDir": dir,
		"tlsCert": certFile, "tlsKey": keyFile, "adminSocket": "-",
		"limits": map[string]any{"maxConnectionsPerSource": perSource}})
	return &floodRig{rep: startReplica(t, cfg), pin: atls.PinOf(ca.cert), iss: rig.iss}
}

// join is a real TPM join; it must succeed.
func (r *floodRig) join(t *testing.T) {
	t.Helper()
	c, err := ticket.New(ticket.Config{Endpoints: []string{r.rep.addr}, Pins: []atls.Pin{r.pin}, Issuer: r.iss,
		Timeout: 30 * time.Second, InitialBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(context.Background(), ticket.Request{NodeName: "node-1",
		DiskUUID: "6c1f0d9e-2b3a-4c5d-8e7f-9a0b1c2d3e4f", Role: latchkeyv1.Role_ROLE_WORKER}); err != nil {
		t.Fatalf("a real join failed during the flood: %v", err)
	}
}

func (r *floodRig) dialGRPC(t *testing.T) *grpc.ClientConn {
	t.Helper()
	tc, _ := atls.ClientConfig([]atls.Pin{r.pin}, false)
	conn, err := grpc.NewClient("passthrough:///"+r.rep.addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// Streams with 1 MiB of metadata are refused by the header limit, and
// more streams than the per-connection limit wait; the verifier's memory
// stays bounded and real joins go on.
func TestFloodHeadersAndStreams(t *testing.T) {
	r := newFloodRig(t, 0)
	before := rssOf(t, r.rep.cmd.Process.Pid)
	big := strings.Repeat("x", 1<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	refused := 0
	for c := range 10 {
		conn := r.dialGRPC(t)
		defer conn.Close()
		for s := range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				md := metadata.Pairs("x-pad", big, "x-n", fmt.Sprint(c*10+s))
				stream, err := latchkeyv1.NewJoinServiceClient(conn).Join(metadata.NewOutgoingContext(ctx, md))
				if err == nil {
					_, err = stream.Recv()
				}
				if err != nil {
					mu.Lock()
					refused++
					mu.Unlock()
				}
			}()
		}
	}
	r.join(t)
	wg.Wait()
	peak := rssOf(t, r.rep.cmd.Process.Pid)
	t.Logf("RSS before %d MiB, after 50 streams x 1 MiB headers %d MiB; %d streams refused", before>>20, peak>>20, refused)
	if refused != 50 {
		t.Fatalf("%d of 50 oversized-header streams were refused, want all", refused)
	}
	if peak > rssCeiling {
		t.Fatalf("verifier RSS %d MiB, ceiling %d MiB", peak>>20, rssCeiling>>20)
	}
	r.join(t)
}

// Connections over the per-source limit are closed at once, and
// connections that never finish a TLS handshake are closed after the
// handshake timeout; real joins go on.
func TestFloodConnectionsAndSlowClients(t *testing.T) {
	r := newFloodRig(t, 16)
	held := acceptedConns(t, r.rep.addr)
	var idle []net.Conn
	for range 16 {
		c, err := net.Dial("tcp", r.rep.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	// The verifier admits at Accept: once it has accepted all 16, the
	// next one is over the limit.
	waitAccepted(t, r.rep.addr, held+16)
	extra, err := net.Dial("tcp", r.rep.addr)
	if err != nil {
		t.Fatal(err)
	}
	extra.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := extra.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("the 17th connection from one source was not closed: %v", err)
	}
	// The silent ones hold no handshake: closed after ConnectionTimeout.
	deadline := time.Now().Add(15 * time.Second)
	for _, c := range idle {
		c.SetReadDeadline(deadline)
		if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			t.Fatalf("a connection that never sent a TLS hello was kept open: %v", err)
		}
	}
	// Slots are free again: a real join succeeds.
	r.join(t)
	if rss := rssOf(t, r.rep.cmd.Process.Pid); rss > rssCeiling {
		t.Fatalf("verifier RSS %d MiB, ceiling %d MiB", rss>>20, rssCeiling>>20)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// acceptedConns counts the established TCP connections on addr (an IPv4
// listener) that a process has accepted: in /proc/net/tcp, a connection
// still in the listen queue has no socket inode yet.
func acceptedConns(t *testing.T, addr string) int {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	const established = "01"
	suffix := fmt.Sprintf(":%04X", p)
	n := 0
	for _, line := range strings.Split(string(b), "\n")[1:] {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		f := strings.Fields(line)
		if len(f) >= 10 && strings.HasSuffix(f[1], suffix) && f[3] == established && f[9] != "0" {
			n++
		}
	}
	return n
}

// waitAccepted waits until want connections on addr are accepted.
func waitAccepted(t *testing.T, addr string, want int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n := acceptedConns(t, addr)
		if n >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the verifier accepted %d connections on %s, want %d", n, addr, want)
		}
	}
}
