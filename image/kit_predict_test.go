package image

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// Tools the kit test needs besides the kit's own (scripts/test.sh installs
// them): the stub stands in for the kernel too (it is a PE image), and
// systemd-measure is the independent oracle of PCR 11.
const (
	stub           = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"
	systemdMeasure = "/usr/lib/systemd/systemd-measure"
)

// TestKitPredictsWithPolicyPredict: build-measured.sh's PCR 11 values are
// `latchkey-verifier policy predict`'s for the same UKI, in the phase the
// agent joins in and, when the root measures phases, in PHASE:ready (the
// value every re-attestation after the boot quotes). A root with no phase
// tooling measures no phase word: its value is systemd-measure --phase=,
// not the enter-initrd value the kit once took from systemd-measure's
// default phase list.
func TestKitPredictsWithPolicyPredict(t *testing.T) {
	for _, tool := range []string{stub, systemdMeasure, "mkfs.ext4", "veritysetup", "objcopy", "mkfs.fat", "mcopy", "sgdisk", "xxd"} {
		if _, err := exec.LookPath(tool); err != nil {
			if _, err := os.Stat(tool); err != nil {
				t.Fatalf("%s missing (scripts/test.sh installs the kit's tools): %v", tool, err)
			}
		}
	}
	verifier := filepath.Join(t.TempDir(), "latchkey-verifier")
	build := exec.Command("go", "build", "-o", verifier, "./verifier/cmd/latchkey-verifier")
	build.Dir = ".."
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		name       string
		tooling    bool
		wantPhases []string
	}{
		{"phase tooling", true, []string{"sysinit", "sysinit:ready"}},
		{"no phase tooling", false, []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, "out")
			runKit(t, verifier, kitRoot(t, dir, tc.tooling), dir, out)
			got := kitPCR11(t, out)
			want := predictPCR11(t, verifier, filepath.Join(out, "uki.efi"), tc.wantPhases)
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Fatalf("pcrs.yaml pcr 11 = %q, policy predict --phase %q = %q", got, tc.wantPhases, want)
			}
			for i, ph := range tc.wantPhases {
				if m := measure(t, dir, out, ph); got[i] != m {
					t.Errorf("pcr 11 in phase %q = %s, systemd-measure --phase=%s = %s", ph, got[i], ph, m)
				}
			}
			if layout := layoutValue(t, out, "PCR11"); layout != got[0] {
				t.Errorf("layout.env PCR11 = %s, want the join's value %s", layout, got[0])
			}
			if !tc.tooling {
				if ei := measure(t, dir, out, "enter-initrd"); got[0] == ei {
					t.Errorf("pcr 11 with no phase tooling is the enter-initrd value %s", ei)
				}
			}
		})
	}
}

// kitRoot writes a minimal root; with tooling it has systemd-pcrphase and
// the TPM library the kit looks for.
func kitRoot(t *testing.T, dir string, tooling bool) string {
	t.Helper()
	root := filepath.Join(dir, "root")
	files := map[string]string{"etc/os-release": "ID=latchkey-test\n"}
	if tooling {
		files["usr/lib/systemd/systemd-pcrphase"] = "#!/bin/true\n"
		files["usr/lib/x86_64-linux-gnu/libtss2-esys.so.0"] = "not a library\n"
	}
	for name, data := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func runKit(t *testing.T, verifier, root, dir, out string) {
	t.Helper()
	initrd := filepath.Join(dir, "initrd")
	if err := os.WriteFile(initrd, []byte(strings.Repeat("initrd ", 500)), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "build-measured.sh", "--root", root, "--kernel", stub, "--initrd", initrd,
		"--out", out, "--no-disk", "--root-size", "8M", "--esp-size", "2", "--cmdline", "console=ttyS0")
	cmd.Env = append(os.Environ(), "LATCHKEY_VERIFIER="+verifier)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build-measured.sh: %v\n%s", err, b)
	}
}

// kitPCR11 reads pcrs.yaml's PCR 11 list.
func kitPCR11(t *testing.T, out string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(out, "pcrs.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		PCRs map[string][]string `json:"pcrs"`
	}
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		t.Fatalf("pcrs.yaml: %v\n%s", err, b)
	}
	return f.PCRs["11"]
}

var hex64 = regexp.MustCompile(`(?m)^    - ([0-9a-f]{64})$`)

// predictPCR11 runs `policy predict` with the given phases.
func predictPCR11(t *testing.T, verifier, uki string, phases []string) []string {
	t.Helper()
	args := []string{"policy", "predict", "--uki", uki, "--secure-boot-off"}
	for _, ph := range phases {
		args = append(args, "--phase", ph)
	}
	b, err := exec.Command(verifier, args...).Output()
	if err != nil {
		t.Fatalf("policy predict: %v", err)
	}
	var v []string
	for _, m := range hex64.FindAllStringSubmatch(string(b), -1) {
		v = append(v, m[1])
	}
	return v
}

// measure is systemd-measure calculate over the kit's section files.
func measure(t *testing.T, dir, out, phase string) string {
	t.Helper()
	b, err := exec.Command(systemdMeasure, "calculate", "--linux="+stub, "--osrel="+filepath.Join(out, "osrel"),
		"--cmdline="+filepath.Join(out, "cmdline"), "--initrd="+filepath.Join(dir, "initrd"), "--bank=sha256",
		"--phase="+phase, "--json=short").Output()
	if err != nil {
		t.Fatalf("systemd-measure: %v", err)
	}
	var r struct {
		SHA256 []struct {
			Hash string `json:"hash"`
		} `json:"sha256"`
	}
	if err := json.Unmarshal(b, &r); err != nil || len(r.SHA256) != 1 {
		t.Fatalf("systemd-measure printed %s (%v)", b, err)
	}
	return r.SHA256[0].Hash
}

func layoutValue(t *testing.T, out, key string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(out, "layout.env"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key+"="); ok {
			return v
		}
	}
	t.Fatalf("layout.env has no %s", key)
	return ""
}

// TestKitHasNoSecondPrediction: the kit's and the VM tier's scripts do not
// run systemd-measure, so PCR 11 has one implementation (policy predict).
func TestKitHasNoSecondPrediction(t *testing.T) {
	var files []string
	for _, g := range []string{"*.sh", "../scripts/vm/*.sh", "../scripts/e2e-vm.sh"} {
		m, err := filepath.Glob(g)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) < 3 {
		t.Fatalf("found only %q", files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "systemd-measure") && !strings.HasPrefix(strings.TrimSpace(l), "#") {
				t.Errorf("%s:%d runs systemd-measure: %s", f, i+1, l)
			}
		}
	}
}
