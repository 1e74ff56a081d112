package sdnotify

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func osGetpid() int { return os.Getpid() }

// TestMain lets the test binary act as a socket-activated child: systemd's
// protocol wants LISTEN_PID to be the child's own pid, which only the child
// knows.
func TestMain(m *testing.M) {
	if os.Getenv("SDNOTIFY_TEST_CHILD") == "1" {
		os.Exit(activatedChild())
	}
	os.Exit(m.Run())
}

func activatedChild() int {
	os.Setenv("LISTEN_PID", fmt.Sprint(os.Getpid()))
	socks, err := TakeSockets()
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	l, err := socks.One("join")
	if err != nil || l == nil {
		fmt.Println("error: no join socket:", err)
		return 1
	}
	defer l.Close()
	fmt.Printf("addr=%s env=%q\n", l.Addr(), os.Getenv("LISTEN_FDS"))
	return 0
}

func TestTakeSocketsFromSystemd(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	f, err := l.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.ExtraFiles = []*os.File{f} // becomes fd 3, SD_LISTEN_FDS_START
	cmd.Env = append(os.Environ(), "SDNOTIFY_TEST_CHILD=1", "LISTEN_FDS=1", "LISTEN_FDNAMES=join")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	want := fmt.Sprintf("addr=%s env=%q", l.Addr(), "")
	if got := strings.TrimSpace(string(out)); got != want {
		t.Fatalf("child printed %q, want %q", got, want)
	}
}

func TestTakeSocketsOutsideActivation(t *testing.T) {
	t.Setenv("LISTEN_PID", "")
	t.Setenv("LISTEN_FDS", "")
	socks, err := TakeSockets()
	if err != nil {
		t.Fatal(err)
	}
	if l, err := socks.One("join"); l != nil || err != nil {
		t.Fatalf("One(join) outside activation = %v, %v; want nil, nil", l, err)
	}
}

func TestOneRefusesAmbiguousName(t *testing.T) {
	a, _ := net.Listen("tcp", "127.0.0.1:0")
	b, _ := net.Listen("tcp", "127.0.0.1:0")
	socks := Sockets{"join": {a, b}}
	defer socks.Close()
	if _, err := socks.One("join"); err == nil {
		t.Fatal("One accepted two sockets with one name")
	}
}
