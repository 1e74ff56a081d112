package load

// The verifier role: the real verifier/app assembly in this process, with
// an in-memory minter, controlled over stdin/stdout by the load generator.

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/verifier/app"
	"github.com/latchkey/latchkey/verifier/token"
)

// Environment of the verifier role.
const (
	envRole      = "LATCHKEY_LOAD_ROLE"
	envConfig    = "LATCHKEY_LOAD_CONFIG"
	roleVerifier = "verifier"
)

// TestMain runs the verifier role instead of the tests when the load
// generator started this binary as its verifier.
func TestMain(m *testing.M) {
	if os.Getenv(envRole) == roleVerifier {
		os.Exit(runVerifier(os.Getenv(envConfig), os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

// runVerifier serves until SIGTERM, SIGINT or the end of control (the
// load generator's stdin pipe, so a dead generator stops it too). The
// audit log goes to stderr, as under systemd.
func runVerifier(configPath string, control io.Reader, out io.Writer) int {
	vals = &validations{}
	log := slog.New(validationLog{Handler: slog.NewTextHandler(os.Stderr, nil), v: vals})
	slog.SetDefault(log)
	if err := serveVerifier(configPath, control, &lineWriter{w: out}, log); err != nil {
		log.Error("load verifier failed", "error", err.Error())
		return 1
	}
	return 0
}

func serveVerifier(configPath string, control io.Reader, out *lineWriter, log *slog.Logger) error {
	cfg, err := app.LoadConfig(configPath)
	if err != nil {
		return err
	}
	app.ReserveGCHeadroom() // as serve does
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	minter := &memMinter{}
	ready := make(chan struct{})
	v, err := app.New(cfg, app.Deps{Logger: log, Listener: lis, Minter: minter, Bindings: &memBindings{}, Ready: func() { close(ready) }})
	if err != nil {
		lis.Close()
		return err
	}
	pin, err := servingPin(cfg)
	if err != nil {
		lis.Close()
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- v.Serve(ctx) }()
	select {
	case <-ready:
	case err := <-done:
		return err
	}
	out.printf("READY %s %s", lis.Addr(), pin)
	ctl := &controller{out: out, minter: minter, stop: stop}
	go ctl.run(control)
	err = <-done
	ctl.stopProfile()
	out.printf("STATS %s", ctl.stats())
	return err
}

func servingPin(cfg *app.Config) (atls.Pin, error) {
	cert, err := app.ServingCertificate(cfg)
	if err != nil {
		return atls.Pin{}, err
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return atls.Pin{}, fmt.Errorf("parse serving certificate: %w", err)
	}
	return atls.PinOf(leaf), nil
}

// lineWriter serializes the reply lines of the verifier role.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, format+"\n", args...)
}

// controller answers the load generator's commands, one per line:
// "stats" (a STATS line), "profile-start PATH" and "profile-stop" (a CPU
// profile of the measured phase only; each answered by an OK or ERR line).
type controller struct {
	out     *lineWriter
	minter  *memMinter
	stop    func()
	mu      sync.Mutex
	profile *os.File
}

func (c *controller) run(control io.Reader) {
	sc := bufio.NewScanner(control)
	for sc.Scan() {
		cmd, arg, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		switch cmd {
		case "stats":
			c.out.printf("STATS %s", c.stats())
		case "profile-start":
			c.reply(c.startProfile(arg))
		case "profile-stop":
			c.reply(c.stopProfile())
		default:
			c.reply(fmt.Errorf("unknown command %q", cmd))
		}
	}
	c.stop()
}

func (c *controller) reply(err error) {
	if err != nil {
		c.out.printf("ERR %v", err)
		return
	}
	c.out.printf("OK")
}

func (c *controller) startProfile(path string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.profile != nil {
		return errors.New("profile already running")
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return err
	}
	c.profile = f
	return nil
}

func (c *controller) stopProfile() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.profile == nil {
		return nil
	}
	pprof.StopCPUProfile()
	err := c.profile.Close()
	c.profile = nil
	return err
}

// verifierStats is what the verifier reports about itself.
type verifierStats struct {
	Mints, Revokes int64
	// CPU is user+system time of the whole process (getrusage).
	CPU        time.Duration
	MaxRSSKiB  int64
	Mallocs    uint64
	TotalAlloc uint64
	NumGC      uint32
	Goroutines int
	// CtxSwitches counts the process's voluntary and involuntary context
	// switches (getrusage): how often its threads slept and were woken.
	CtxSwitches int64
	// SysmonCPU and SysmonSwitches are the runtime's sysmon thread's CPU
	// time and times it was scheduled (threads.go): what a join that
	// wakes an idle process pays for the runtime's monitor.
	SysmonCPU      time.Duration
	SysmonSwitches int64
	// Validations, ValidationP50Ms and ValidationP99Ms are of the joins
	// accepted since the previous stats (validation_test.go).
	Validations                      int
	ValidationP50Ms, ValidationP99Ms float64
}

// vals collects the child's validation times.
var vals *validations

func (c *controller) stats() string {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	n, p50, p99 := vals.take()
	sysmon := sysmonThread()
	b, _ := json.Marshal(verifierStats{
		Validations: n, ValidationP50Ms: p50, ValidationP99Ms: p99,
		Mints: c.minter.mints.Load(), Revokes: c.minter.revokes.Load(),
		CPU:       time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		MaxRSSKiB: ru.Maxrss, Mallocs: ms.Mallocs, TotalAlloc: ms.TotalAlloc, NumGC: ms.NumGC,
		Goroutines: runtime.NumGoroutine(), CtxSwitches: ru.Nvcsw + ru.Nivcsw,
		SysmonCPU: sysmon.cpu, SysmonSwitches: sysmon.slices,
	})
	return string(b)
}

// memMinter is the token step in memory: a kubeadm-shaped random token per
// join, nothing stored. It counts mints and revokes so the generator can
// check that every join minted a token and every ticket was acknowledged.
type memMinter struct{ mints, revokes atomic.Int64 }

var _ token.Minter = (*memMinter)(nil)

// fakeCAHash is a CA pin of the right shape; no agent here uses it.
const fakeCAHash = "sha256:1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809"

func (m *memMinter) Mint(_ context.Context, _ token.Request) (*token.Grant, error) {
	id, secret := randomToken(6), randomToken(16)
	m.mints.Add(1)
	return &token.Grant{
		ID: id, Token: id + "." + secret, Expiry: time.Now().Add(30 * time.Minute),
		Endpoints: []string{"10.96.0.1:6443"}, CACertHashes: []string{fakeCAHash},
	}, nil
}

func (m *memMinter) Revoke(context.Context, string) error {
	m.revokes.Add(1)
	return nil
}

const tokenAlphabet = "0123456789abcdefghijklmnopqrstuvwxyz"

// randomToken returns n characters of [a-z0-9] (slightly biased; it is a
// stand-in for a token nobody can use).
func randomToken(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	for i := range b {
		b[i] = tokenAlphabet[int(b[i])%len(tokenAlphabet)]
	}
	return string(b)
}
