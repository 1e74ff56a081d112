package disk

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAlteredHeaderRecoveryPath: an operator adds a recovery keyslot to
// the node's own disk. The agent refuses it, says what was altered and
// points to the recovery path, never to wiping; following that path
// (docs/disk.md, "Recovering an altered header": luksKillSlot with the
// disk key) brings the disk back with its data.
func TestAlteredHeaderRecoveryPath(t *testing.T) {
	r := newRig(t, testDiskSize)
	key := testKey(31)
	plan, _ := r.mustBoot(r.stage(nil), key)
	if err := os.WriteFile(filepath.Join(r.root, "etc/kubernetes/kubelet.conf"), []byte("joined"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.kernel.powerOff()

	recovery := filepath.Join(t.TempDir(), "recovery.key")
	if err := os.WriteFile(recovery, []byte("an operator's recovery passphrase"), 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, key, "cryptsetup", "luksAddKey", "--batch-mode", "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000",
		"--key-file", "-", r.dev, recovery)
	before := checksum(t, r.dev)

	_, err := r.stage(nil).Prepare(context.Background())
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	for _, want := range []string{"latchkey's LUKS2 header, altered since latchkey wrote it", `keyslots has unexpected "1"`,
		"its data is still there", `docs/disk.md, "Recovering an altered header"`} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal %q lacks %q", msg, want)
		}
	}
	if !errors.Is(err, ErrHeaderRejected) || strings.Contains(strings.ToLower(msg), "wipe") {
		t.Fatalf("refusal %v: want ErrHeaderRejected and no hint to wipe", err)
	}
	if checksum(t, r.dev) != before {
		t.Fatal("device changed")
	}

	// The recovery path, as documented.
	run(t, key, "cryptsetup", "luksKillSlot", "--batch-mode", "--key-file", "-", r.dev, "1")
	plan2, res := r.mustBoot(r.stage(nil), key)
	if !plan2.Rejoin || plan2.UUID != plan.UUID || res.Formatted || res.MadeFileSystem || !res.HasKubeletCredentials {
		t.Fatalf("after the recovery: plan %+v, result %+v; want the node's own disk back, data intact", plan2, res)
	}
}
