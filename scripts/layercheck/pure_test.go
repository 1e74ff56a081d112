package layercheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

// purePackages are the packages that do no I/O: each may import only the
// packages listed (exactly; a prefix such as "crypto/" would let in
// crypto/x509, which reads the system's roots from disk). Their tests may
// import anything. The list names what a package needs, so a new import
// is a decision made here, in review.
var purePackages = map[string][]string{
	// The LUKS2 on-disk format: bytes in, bytes out. crypto/rand is the
	// kernel's random generator (the salts and anti-forensic stripes),
	// not the device; protocol is the wire vocabulary (the UUID rule).
	// The offline token's fields are checked with their own decoders:
	// the wire OfflineGrant (proto) and offline.Sealed.UnmarshalBinary,
	// a pure function (that package's TPM calls take a transport the
	// caller opened; it opens no device).
	"agent/disk/luks2": {
		"bytes", "crypto/aes", "crypto/rand", "crypto/sha256", "crypto/subtle",
		"encoding/base64", "encoding/binary", "encoding/json", "errors", "fmt", "hash", "io",
		"reflect", "slices", "strconv", "strings",
		"golang.org/x/crypto/pbkdf2", "golang.org/x/crypto/xts",
		"google.golang.org/protobuf/proto",
		module + "protocol", module + "proto/latchkey/v1", module + "attest/tpm/offline",
	},
}

// impure returns every import of a pure package its list does not name,
// as readable lines.
func impure(imports map[string][]string, allowed map[string][]string) []string {
	var out []string
	for p, imps := range imports {
		for _, imp := range imps {
			if !contains(allowed[p], imp) {
				out = append(out, fmt.Sprintf("%s imports %s: it does no I/O and may import only what purePackages lists", p, imp))
			}
		}
	}
	sort.Strings(out)
	return out
}

// pureImports lists the non-test imports of every package in
// purePackages, from `go list`.
func pureImports(t *testing.T) map[string][]string {
	t.Helper()
	var paths []string
	for p := range purePackages {
		paths = append(paths, module+p)
	}
	cmd := exec.Command("go", append([]string{"list", "-json=ImportPath,Imports"}, paths...)...)
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, stderr.String())
	}
	got := map[string][]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("go list output: %v", err)
		}
		got[strings.TrimPrefix(p.ImportPath, module)] = p.Imports
	}
	if len(got) != len(purePackages) {
		t.Fatalf("go list found %d of the %d pure packages", len(got), len(purePackages))
	}
	return got
}

func TestPurePackagesDoNoIO(t *testing.T) {
	if v := impure(pureImports(t), purePackages); len(v) > 0 {
		t.Errorf("a pure package imports more than its list (scripts/layercheck/pure_test.go):\n  %s", strings.Join(v, "\n  "))
	}
}

// TestImpureImportsFound checks the checker: the I/O packages are refused
// with the package named, and so are those a prefix rule would let
// through (crypto/x509 reads files, os/exec is not os).
func TestImpureImportsFound(t *testing.T) {
	const p = "agent/disk/luks2"
	for _, c := range []struct {
		imp  string
		want bool
	}{
		{"os", true},
		{"os/exec", true},
		{"syscall", true},
		{"golang.org/x/sys/unix", true},
		{"net", true},
		{"io/fs", true},
		{"crypto/x509", true},
		{module + "agent/disk", true},
		{"crypto/sha256", false},
		{module + "protocol", false},
	} {
		got := impure(map[string][]string{p: {c.imp}}, purePackages)
		want := []string(nil)
		if c.want {
			want = []string{p + " imports " + c.imp + ": it does no I/O and may import only what purePackages lists"}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: %q, want %q", c.imp, got, want)
		}
	}
}
