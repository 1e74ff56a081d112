// Package layercheck holds latchkey's layer map as a test: which top-level
// parts of the product may import which. The rules held by habit before;
// written down here, a change that breaks one fails the static tier
// (scripts/test.sh) instead of surfacing as a binary that links the other
// side's code.
//
// The map:
//
//   - internal/ imports nothing of the product, its tests included: it
//     holds helpers any part may use.
//   - proto/ imports nothing of the product; protocol/ only proto/ and
//     internal/.
//   - attest/ (the evidence variants, issuer and validator side by side)
//     imports neither agent/ nor verifier/.
//   - agent/ and verifier/ do not import each other. A test may, when it
//     is named in contractTests: those tests run one side against the
//     other's real code (an agent against the assembled verifier), which
//     is the point of them.
//   - Each evidence variant keeps its two halves apart (sideRules): the
//     validator (attest/<variant>, the verifier's half), the issuer
//     (attest/<variant>/issuer, the agent's half), what both read
//     (attest/<variant>/wire) and other shared packages beside them. The
//     agent imports no validator, the verifier no issuer, an issuer no
//     validator, nothing else under attest/ an issuer, and a wire
//     package neither. Tests may cross: a validator's tests judge real
//     issuers' evidence. scripts/test.sh checks the same of what each
//     binary links, transitively.
//
// It holds no code outside its tests.
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

const module = "github.com/latchkey/latchkey/"

// rule forbids imports from the packages under from to those under any
// of to. Parts are top-level directories of the module.
type rule struct {
	from string
	to   []string
	// tests says whether the rule binds test imports too.
	tests bool
}

var layerRules = []rule{
	{from: "internal", to: []string{"agent", "verifier", "attest", "proto", "protocol", "image", "scripts", "units"}, tests: true},
	{from: "proto", to: []string{"agent", "verifier", "attest", "protocol", "internal", "image", "scripts"}, tests: true},
	{from: "protocol", to: []string{"agent", "verifier", "attest", "image", "scripts"}, tests: true},
	{from: "attest", to: []string{"agent", "verifier", "image", "scripts"}, tests: true},
	{from: "agent", to: []string{"verifier", "image", "scripts"}, tests: true},
	{from: "verifier", to: []string{"agent", "image", "scripts"}, tests: true},
}

// contractTests are the test-only imports across agent/ and verifier/
// that are allowed: importer package → imported package.
var contractTests = map[string][]string{
	// The agent's process tests run against an assembled verifier.
	"agent/cmd/latchkey-agent": {"verifier/app", "verifier/servingcert"},
	// The verifier's join tests drive it with the real agent's ticket client.
	"verifier/app":                   {"agent/ticket"},
	"verifier/cmd/latchkey-verifier": {"agent/ticket"},
	"verifier/service":               {"agent/ticket"},
}

// sideRule forbids non-test imports from packages of one kind to
// packages of another. A package's kind is its side of a variant
// (sideOf) when it has one, else its part (the top-level directory).
type sideRule struct {
	from, to []string
	why      string
}

// The sides of an evidence variant's packages.
const (
	sideValidator = "validator" // attest/<variant>: the verifier's half
	sideIssuer    = "issuer"    // attest/<variant>/issuer: the agent's half
	sideWire      = "wire"      // attest/<variant>/wire: what both halves read
	sideShared    = "shared"    // attest/<variant>/<other>: beside the halves
)

var sideRules = []sideRule{
	{from: []string{"agent"}, to: []string{sideValidator}, why: "the agent links no validator"},
	{from: []string{"verifier"}, to: []string{sideIssuer}, why: "the verifier links no issuer"},
	{from: []string{sideIssuer, sideWire}, to: []string{sideValidator}, why: "the agent's half links no validator"},
	{from: []string{sideValidator, sideWire, sideShared}, to: []string{sideIssuer}, why: "only the agent links an issuer"},
}

// notVariants are the packages directly under attest/ that are shared
// by every variant rather than a variant's validator.
var notVariants = map[string]bool{"atls": true, "attesttest": true, "uefilog": true}

// sideOf names the side of a variant a package is on, "" for a package
// outside every variant's folder and for a variant's test helpers
// (tpmtest, snptest: they drive both halves, and scripts/test.sh keeps
// them out of the binaries).
func sideOf(p string) string {
	parts := strings.Split(p, "/")
	if parts[0] != "attest" || len(parts) < 2 || notVariants[parts[1]] || strings.HasSuffix(parts[len(parts)-1], "test") {
		return ""
	}
	switch {
	case len(parts) == 2:
		return sideValidator
	case parts[2] == "issuer":
		return sideIssuer
	case parts[2] == "wire":
		return sideWire
	}
	return sideShared
}

func kind(p string) string {
	if s := sideOf(p); s != "" {
		return s
	}
	return part(p)
}

// sideViolations returns every non-test edge the side rules forbid.
func sideViolations(edges []edge, rules []sideRule) []string {
	var out []string
	for _, e := range edges {
		if e.test {
			continue
		}
		for _, r := range rules {
			if contains(r.from, kind(e.from)) && contains(r.to, kind(e.to)) {
				out = append(out, fmt.Sprintf("%s (%s) imports %s (%s): %s", e.from, kind(e.from), e.to, kind(e.to), r.why))
			}
		}
	}
	sort.Strings(out)
	return out
}

// pkg is what `go list -json` says of one package.
type pkg struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// edge is one import of the module's own code, paths relative to the module.
type edge struct {
	from, to string
	test     bool
}

// violations returns every edge the rules forbid, as readable lines.
func violations(edges []edge, rules []rule, allowed map[string][]string) []string {
	var out []string
	for _, e := range edges {
		for _, r := range rules {
			if part(e.from) != r.from || (e.test && !r.tests) || !contains(r.to, part(e.to)) {
				continue
			}
			if e.test && contains(allowed[e.from], e.to) {
				continue
			}
			kind := "imports"
			if e.test {
				kind = "imports (in a test)"
			}
			out = append(out, fmt.Sprintf("%s %s %s: %s/ must not import %s/", e.from, kind, e.to, r.from, part(e.to)))
		}
	}
	sort.Strings(out)
	return out
}

func part(p string) string {
	first, _, _ := strings.Cut(p, "/")
	return first
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// moduleEdges lists every import of the module's own packages by the
// module's packages (tests included), from `go list`.
func moduleEdges(t *testing.T) []edge {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,TestImports,XTestImports", module+"...")
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, stderr.String())
	}
	var edges []edge
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("go list output: %v", err)
		}
		from := strings.TrimPrefix(p.ImportPath, module)
		add := func(imports []string, test bool) {
			for _, imp := range imports {
				if to, ok := strings.CutPrefix(imp, module); ok && to != from {
					edges = append(edges, edge{from: from, to: to, test: test})
				}
			}
		}
		add(p.Imports, false)
		add(p.TestImports, true)
		add(p.XTestImports, true)
	}
	if len(edges) == 0 {
		t.Fatal("go list found no imports of the module's own packages")
	}
	return edges
}

func TestLayerMap(t *testing.T) {
	if v := violations(moduleEdges(t), layerRules, contractTests); len(v) > 0 {
		t.Errorf("the layer map is broken (scripts/layercheck):\n  %s", strings.Join(v, "\n  "))
	}
}

func TestSideMap(t *testing.T) {
	if v := sideViolations(moduleEdges(t), sideRules); len(v) > 0 {
		t.Errorf("a variant's halves are mixed (scripts/layercheck):\n  %s", strings.Join(v, "\n  "))
	}
}

// TestSideViolationsFound checks the side rules on made-up edges: each
// rule catches its edge, for any variant's folder; the same edge in a
// test, and the imports the map allows, pass.
func TestSideViolationsFound(t *testing.T) {
	for _, c := range []struct {
		name string
		e    edge
		want string
	}{
		{"agent to validator", edge{"agent/app", "attest/tpm", false}, "agent/app (agent) imports attest/tpm (validator): the agent links no validator"},
		{"agent to a new variant's validator", edge{"agent/app", "attest/tdx", false}, "agent/app (agent) imports attest/tdx (validator): the agent links no validator"},
		{"verifier to issuer", edge{"verifier/app", "attest/snp/issuer", false}, "verifier/app (verifier) imports attest/snp/issuer (issuer): the verifier links no issuer"},
		{"issuer to validator", edge{"attest/tpm/issuer", "attest/tpm", false}, "attest/tpm/issuer (issuer) imports attest/tpm (validator): the agent's half links no validator"},
		{"issuer to another variant's validator", edge{"attest/tpm/issuer", "attest/snp", false}, "attest/tpm/issuer (issuer) imports attest/snp (validator): the agent's half links no validator"},
		{"wire to validator", edge{"attest/snp/wire", "attest/snp", false}, "attest/snp/wire (wire) imports attest/snp (validator): the agent's half links no validator"},
		{"validator to issuer", edge{"attest/tpm", "attest/tpm/issuer", false}, "attest/tpm (validator) imports attest/tpm/issuer (issuer): only the agent links an issuer"},
		{"shared to issuer", edge{"attest/tpm/bootlog", "attest/tpm/issuer", false}, "attest/tpm/bootlog (shared) imports attest/tpm/issuer (issuer): only the agent links an issuer"},
		{"validator test uses an issuer", edge{"attest/tpm", "attest/tpm/issuer", true}, ""},
		{"verifier test uses an issuer", edge{"verifier/app", "attest/tpm/issuer", true}, ""},
		{"agent to issuer", edge{"agent/app", "attest/tpm/issuer", false}, ""},
		{"agent to shared", edge{"agent/app", "attest/tpm/bootlog", false}, ""},
		{"verifier to validator", edge{"verifier/policy", "attest/snp", false}, ""},
		{"issuer to wire", edge{"attest/snp/issuer", "attest/snp/wire", false}, ""},
		{"agent to the contract", edge{"agent/app", "attest", false}, ""},
		{"test helper to issuer", edge{"attest/tpm/tpmtest", "attest/tpm/issuer", false}, ""},
		{"agent to atls", edge{"agent/ticket", "attest/atls", false}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := sideViolations([]edge{c.e}, sideRules)
			switch {
			case c.want == "" && len(got) != 0:
				t.Fatalf("allowed edge refused: %v", got)
			case c.want != "" && (len(got) != 1 || got[0] != c.want):
				t.Fatalf("violations = %q, want %q", got, c.want)
			}
		})
	}
}

// TestContractTestsStillExist keeps the allow-list honest: an entry no
// test needs any more is removed, so it cannot hide a new import later.
func TestContractTestsStillExist(t *testing.T) {
	seen := map[string]bool{}
	for _, e := range moduleEdges(t) {
		if e.test {
			seen[e.from+" "+e.to] = true
		}
	}
	for from, tos := range contractTests {
		for _, to := range tos {
			if !seen[from+" "+to] {
				t.Errorf("contractTests allows %s → %s, which no test imports any more: remove the entry", from, to)
			}
		}
	}
}

// TestViolationsFound checks the checker on made-up graphs: each rule
// catches its edge, a contract test passes only as a test import, and
// an import the map allows passes.
func TestViolationsFound(t *testing.T) {
	for _, c := range []struct {
		name string
		e    edge
		want string
	}{
		{"internal up", edge{"internal/cli", "agent/config", false}, "internal/cli imports agent/config: internal/ must not import agent/"},
		{"internal test up", edge{"internal/k8stest", "verifier/token", true}, "internal/k8stest imports (in a test) verifier/token: internal/ must not import verifier/"},
		{"attest to verifier", edge{"attest/tpm", "verifier/policy", false}, "attest/tpm imports verifier/policy: attest/ must not import verifier/"},
		{"agent to verifier", edge{"agent/boot", "verifier/keys", false}, "agent/boot imports verifier/keys: agent/ must not import verifier/"},
		{"verifier to agent", edge{"verifier/service", "agent/disk", false}, "verifier/service imports agent/disk: verifier/ must not import agent/"},
		{"contract pair outside a test", edge{"verifier/service", "agent/ticket", false}, "verifier/service imports agent/ticket: verifier/ must not import agent/"},
		{"unlisted test pair", edge{"verifier/service", "agent/disk", true}, "verifier/service imports (in a test) agent/disk: verifier/ must not import agent/"},
		{"protocol to attest", edge{"protocol", "attest/tpm", false}, "protocol imports attest/tpm: protocol/ must not import attest/"},
		{"contract test", edge{"verifier/service", "agent/ticket", true}, ""},
		{"allowed direction", edge{"verifier/service", "attest/tpm", false}, ""},
		{"inside a part", edge{"agent/boot", "agent/disk", false}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := violations([]edge{c.e}, layerRules, contractTests)
			switch {
			case c.want == "" && len(got) != 0:
				t.Fatalf("allowed edge refused: %v", got)
			case c.want != "" && (len(got) != 1 || got[0] != c.want):
				t.Fatalf("violations = %q, want %q", got, c.want)
			}
		})
	}
}
