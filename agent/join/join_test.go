package join

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/internal/execx"
	"github.com/latchkey/latchkey/internal/execx/execxtest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

var (
	pinA = "sha256:" + strings.Repeat("a1", 32)
	pinB = "sha256:" + strings.Repeat("b2", 32)
	key  = strings.Repeat("c3", 32)
)

func workerTicket() Ticket {
	return Ticket{
		NodeName:     "node-1",
		Endpoints:    []string{"10.0.0.1:6443", "10.0.0.2:6443"},
		Token:        "abcdef.0123456789abcdef",
		CACertHashes: []string{pinA, pinB},
	}
}

func newJoiner(t *testing.T, r execx.Runner, mod func(*Config)) *Joiner {
	t.Helper()
	cfg := Config{Runner: r, Dir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)}
	if mod != nil {
		mod(&cfg)
	}
	j, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

const wantWorker = `apiVersion: kubeadm.k8s.io/v1beta4
discovery:
  bootstrapToken:
    apiServerEndpoint: 10.0.0.1:6443
    caCertHashes:
    - sha256:a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1
    - sha256:b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2
    token: abcdef.0123456789abcdef
kind: JoinConfiguration
nodeRegistration:
  name: node-1
  taints: null
timeouts:
  discovery: 30s
`

func TestRenderWorker(t *testing.T) {
	j := newJoiner(t, &execxtest.Fake{}, func(c *Config) { c.DiscoveryTimeout = 30 * time.Second })
	out, err := j.Render(workerTicket())
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != wantWorker {
		t.Fatalf("got\n%s\nwant\n%s", out, wantWorker)
	}
}

func TestRenderControlPlane(t *testing.T) {
	j := newJoiner(t, &execxtest.Fake{}, func(c *Config) {
		c.AdvertiseAddress, c.BindPort, c.CRISocket = "10.0.0.9", 6443, "unix:///run/containerd/containerd.sock"
	})
	tk := workerTicket()
	tk.ControlPlane, tk.CertificateKey = true, key
	out, err := j.Render(tk)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"controlPlane:\n  certificateKey: " + key + "\n  localAPIEndpoint:\n    advertiseAddress: 10.0.0.9\n    bindPort: 6443\n",
		"criSocket: unix:///run/containerd/containerd.sock\n",
	} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("missing %q in\n%s", want, out)
		}
	}
}

func TestRenderRedacted(t *testing.T) {
	j := newJoiner(t, &execxtest.Fake{}, nil)
	tk := workerTicket()
	tk.ControlPlane, tk.CertificateKey = true, key
	out, err := j.RenderRedacted(tk)
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	if strings.Contains(s, "0123456789abcdef") || strings.Contains(s, key) {
		t.Fatalf("secret in redacted output:\n%s", s)
	}
	if !strings.Contains(s, "token: abcdef.<redacted>\n") || !strings.Contains(s, "certificateKey: <redacted>\n") {
		t.Fatalf("redaction markers missing:\n%s", s)
	}
}

func TestRenderRefusesBadTickets(t *testing.T) {
	j := newJoiner(t, &execxtest.Fake{}, nil)
	subdomain := "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
	cases := []struct {
		name string
		mod  func(*Ticket)
		want string
	}{
		{"no token", func(tk *Ticket) { tk.Token = "" }, "join: ticket carries no valid bootstrap token"},
		{"capital in token", func(tk *Ticket) { tk.Token = "ABCDEF.0123456789abcdef" }, "join: ticket carries no valid bootstrap token"},
		{"token secret one short", func(tk *Ticket) { tk.Token = "abcdef.0123456789abcde" }, "join: ticket carries no valid bootstrap token"},
		{"token with a newline", func(tk *Ticket) { tk.Token = "abcdef.0123456789abcdef\n" }, "join: ticket carries no valid bootstrap token"},
		{"no pins", func(tk *Ticket) { tk.CACertHashes = nil }, "join: ticket carries no CA cert hash; refusing unpinned discovery"},
		{"short pin", func(tk *Ticket) { tk.CACertHashes = []string{"sha256:zz"} }, `join: CA cert hash "sha256:zz" is not sha256:<64 hex>`},
		{"second pin upper-case", func(tk *Ticket) { tk.CACertHashes = []string{pinA, strings.ToUpper(pinB)} },
			`join: CA cert hash "` + strings.ToUpper(pinB) + `" is not sha256:<64 hex>`},
		{"no endpoint", func(tk *Ticket) { tk.Endpoints = nil }, "join: ticket names no API server endpoint"},
		{"endpoint without port", func(tk *Ticket) { tk.Endpoints = []string{"no-port"} },
			`join: API server endpoint "no-port": address no-port: missing port in address`},
		{"underscore in node", func(tk *Ticket) { tk.NodeName = "Node_1" }, `join: node name "Node_1": ` + subdomain},
		{"node ends in a dot", func(tk *Ticket) { tk.NodeName = "node-1." }, `join: node name "node-1.": ` + subdomain},
		{"node name too long", func(tk *Ticket) { tk.NodeName = strings.Repeat("a", 254) },
			`join: node name "` + strings.Repeat("a", 254) + `": must be no more than 253 characters`},
		{"cp, no key", func(tk *Ticket) { tk.ControlPlane = true }, "join: control-plane ticket carries no valid certificate key"},
		{"cp, short key", func(tk *Ticket) { tk.ControlPlane, tk.CertificateKey = true, "abcd" }, "join: control-plane ticket carries no valid certificate key"},
		{"cp, upper-case key", func(tk *Ticket) { tk.ControlPlane, tk.CertificateKey = true, strings.ToUpper(key) },
			"join: control-plane ticket carries no valid certificate key"},
	}
	for _, c := range cases {
		tk := workerTicket()
		c.mod(&tk)
		if _, err := j.Render(tk); err == nil || err.Error() != c.want {
			t.Errorf("%s: err = %v, want %q", c.name, err, c.want)
		}
	}
}

// The edges the checks must let through: a 253-character name of short
// labels, digits-only token parts, a worker ticket whose certificate key
// is not checked (a worker never uses one).
func TestRenderAcceptsEdgeTickets(t *testing.T) {
	j := newJoiner(t, &execxtest.Fake{}, nil)
	for name, mod := range map[string]func(*Ticket){
		"253-character node name":     func(tk *Ticket) { tk.NodeName = "a" + strings.Repeat(".a", 126) },
		"digits-only token":           func(tk *Ticket) { tk.Token = "012345.0123456789012345" },
		"worker with a junk cert key": func(tk *Ticket) { tk.CertificateKey = "junk" },
		"IPv6 endpoint":               func(tk *Ticket) { tk.Endpoints = []string{"[2001:db8::1]:6443"} },
	} {
		tk := workerTicket()
		mod(&tk)
		if _, err := j.Render(tk); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// checkingRunner checks the config file kubeadm is given, then answers
// from the Fake.
type checkingRunner struct {
	t    *testing.T
	fake *execxtest.Fake
	seen []string
}

func (c *checkingRunner) Run(ctx context.Context, cmd execx.Cmd) (execx.Result, error) {
	if len(cmd.Args) > 2 && cmd.Args[0] == "join" {
		path := cmd.Args[2]
		c.seen = append(c.seen, path)
		fi, err := os.Stat(path)
		if err != nil {
			c.t.Errorf("config file: %v", err)
		} else if fi.Mode().Perm() != 0o600 {
			c.t.Errorf("config file mode %v, want 0600", fi.Mode().Perm())
		}
		if b, _ := os.ReadFile(path); !strings.Contains(string(b), "token: abcdef.0123456789abcdef") {
			c.t.Errorf("config file lacks the token:\n%s", b)
		}
	}
	return c.fake.Run(ctx, cmd)
}

func TestJoinWritesAndRemovesConfig(t *testing.T) {
	cr := &checkingRunner{t: t, fake: &execxtest.Fake{Rules: []execxtest.Rule{{Match: "kubeadm join", Stdout: "line one\nThis node has joined the cluster\n"}}}}
	j := newJoiner(t, cr, nil)
	if err := j.Join(context.Background(), workerTicket()); err != nil {
		t.Fatal(err)
	}
	if len(cr.seen) != 1 {
		t.Fatalf("kubeadm join ran %d times", len(cr.seen))
	}
	if _, err := os.Stat(cr.seen[0]); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("config file left behind: %v", err)
	}
	calls := cr.fake.Calls()
	if got := calls[0].Cmd.String(); got != "kubeadm join --config "+cr.seen[0] {
		t.Fatalf("command %q", got)
	}
	if cr.fake.Ran("kubeadm reset") != 0 {
		t.Fatal("reset after a successful join")
	}
}

func TestJoinFailureResets(t *testing.T) {
	f := &execxtest.Fake{Rules: []execxtest.Rule{{Match: "kubeadm join", ExitCode: 1, Stderr: "error execution phase preflight"}}}
	sock := listenUnix(t)
	j := newJoiner(t, f, func(c *Config) { c.CRISocket = "unix://" + sock })
	tk := workerTicket()
	tk.ControlPlane, tk.CertificateKey = true, key
	err := j.Join(context.Background(), tk)
	if execx.ExitCode(err) != 1 || !strings.Contains(err.Error(), "preflight") {
		t.Fatalf("err = %v", err)
	}
	calls := f.Calls()
	if len(calls) != 2 || !strings.HasSuffix(calls[0].Cmd.String(), " --control-plane") ||
		calls[1].Cmd.String() != "kubeadm reset -f --cri-socket unix://"+sock {
		t.Fatalf("calls %v", calls)
	}
}

func TestJoinDryRunDoesNotReset(t *testing.T) {
	f := &execxtest.Fake{Rules: []execxtest.Rule{{Match: "kubeadm join", ExitCode: 1}}}
	j := newJoiner(t, f, func(c *Config) { c.DryRun = true })
	if err := j.Join(context.Background(), workerTicket()); err == nil {
		t.Fatal("failure not reported")
	}
	calls := f.Calls()
	if len(calls) != 1 || !strings.HasSuffix(calls[0].Cmd.String(), " --dry-run") {
		t.Fatalf("calls %v", calls)
	}
	// kubeadm's "would write" files (the token among them) go to a private
	// directory that is gone afterwards, not to /etc/kubernetes/tmp.
	env := calls[0].Cmd.Env
	if len(env) != 1 || !strings.HasPrefix(env[0], "KUBEADM_JOIN_DRYRUN_DIR="+j.cfg.Dir+"/") {
		t.Fatalf("env %v", env)
	}
	if _, err := os.Stat(strings.TrimPrefix(env[0], "KUBEADM_JOIN_DRYRUN_DIR=")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("dry-run directory left behind: %v", err)
	}
}

func TestTicketFrom(t *testing.T) {
	pt := &latchkeyv1.Ticket{ApiServerEndpoints: []string{"a:1"}, Token: "abcdef.0123456789abcdef",
		CaCertHashes: []string{pinA}, CertificateKey: key}
	tk := TicketFrom("n", latchkeyv1.Role_ROLE_CONTROL_PLANE, pt)
	if !tk.ControlPlane || tk.CertificateKey != key || tk.Endpoints[0] != "a:1" || tk.NodeName != "n" {
		t.Fatalf("%+v", tk)
	}
}
