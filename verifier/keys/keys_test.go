package keys

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// rfc5869Case1 is RFC 5869 test case 1 (SHA-256), checked through the same
// crypto/hkdf primitive DiskKey uses, so the vector pins the algorithm.
func TestHKDFRFC5869Case1(t *testing.T) {
	ikm := bytes.Repeat([]byte{0x0b}, 22)
	salt, _ := hex.DecodeString("000102030405060708090a0b0c")
	info, _ := hex.DecodeString("f0f1f2f3f4f5f6f7f8f9")
	want := "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
	got := hkdfManual(ikm, salt, info, 42)
	if hex.EncodeToString(got) != want {
		t.Fatalf("manual HKDF = %x, want %s", got, want)
	}
}

// hkdfManual is RFC 5869 written out with HMAC, independent of crypto/hkdf.
func hkdfManual(ikm, salt, info []byte, n int) []byte {
	ext := hmac.New(sha256.New, salt)
	ext.Write(ikm)
	prk := ext.Sum(nil)
	var out, prev []byte
	for i := byte(1); len(out) < n; i++ {
		m := hmac.New(sha256.New, prk)
		m.Write(prev)
		m.Write(info)
		m.Write([]byte{i})
		prev = m.Sum(nil)
		out = append(out, prev...)
	}
	return out[:n]
}

func TestDiskKeyKnownAnswer(t *testing.T) {
	master := bytes.Repeat([]byte{0x42}, 32)
	salt := []byte("cluster-salt")
	uuid := "0b7c1d6e-3f2a-4c5b-9d8e-7f6a5b4c3d2e"
	d, err := NewDeriver(master, salt)
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.DiskKey(uuid)
	if err != nil {
		t.Fatal(err)
	}
	want := hkdfManual(master, salt, []byte("latchkey/v1 disk "+uuid), 32)
	if !bytes.Equal(got, want) {
		t.Fatalf("DiskKey = %x, want %x", got, want)
	}
	// A fixed vector, so a change of the derivation is caught even if both
	// implementations above drift together.
	const fixed = "98b091695bff135913523647bb2a9ecae8dbd1c7f12a8aa6fe464b426f4f5d31"
	if hex.EncodeToString(got) != fixed {
		t.Fatalf("DiskKey = %x, want the pinned vector %s", got, fixed)
	}
}

func TestDiskKeyDeterministicAndDistinct(t *testing.T) {
	master := bytes.Repeat([]byte{7}, 32)
	a, _ := NewDeriver(master, []byte("salt-a"))
	b, _ := NewDeriver(master, []byte("salt-b"))
	u1, u2 := "00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002"
	k1, _ := a.DiskKey(u1)
	k1again, _ := a.DiskKey(u1)
	k2, _ := a.DiskKey(u2)
	k1b, _ := b.DiskKey(u1)
	if !bytes.Equal(k1, k1again) {
		t.Fatal("same uuid gave different keys")
	}
	if bytes.Equal(k1, k2) || bytes.Equal(k1, k1b) {
		t.Fatal("different uuid or salt gave the same key")
	}
}

func TestDiskKeyRefusesNonCanonicalUUID(t *testing.T) {
	d, _ := NewDeriver(bytes.Repeat([]byte{1}, 32), []byte("s"))
	for _, u := range []string{"", "0B7C1D6E-3F2A-4C5B-9D8E-7F6A5B4C3D2E", "0b7c1d6e3f2a4c5b9d8e7f6a5b4c3d2e", "../etc/passwd"} {
		if _, err := d.DiskKey(u); err == nil || !strings.Contains(err.Error(), "not a canonical") {
			t.Errorf("DiskKey(%q) err = %v, want canonical-uuid refusal", u, err)
		}
	}
}

func TestNewDeriverRefusesShortSecretAndEmptySalt(t *testing.T) {
	if _, err := NewDeriver(make([]byte, 31), []byte("s")); err == nil || !strings.Contains(err.Error(), "at least 32") {
		t.Fatalf("short secret: err = %v", err)
	}
	if _, err := NewDeriver(make([]byte, 32), nil); err == nil || !strings.Contains(err.Error(), "salt is empty") {
		t.Fatalf("empty salt: err = %v", err)
	}
}

func TestLoadMasterSecret(t *testing.T) {
	dir := t.TempDir()
	secret := bytes.Repeat([]byte{0xaa}, 48)
	if err := os.WriteFile(filepath.Join(dir, CredentialName), secret, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CREDENTIALS_DIRECTORY", dir)
	got, err := LoadMasterSecret("")
	if err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("from credentials dir: %x, %v", got, err)
	}
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("tiny"), 0o600)
	if _, err := LoadMasterSecret(short); err == nil || !strings.Contains(err.Error(), "want at least 32") {
		t.Fatalf("short file: err = %v", err)
	}
	big := filepath.Join(dir, "big")
	os.WriteFile(big, make([]byte, MaxMasterSecretSize+1), 0o600)
	if _, err := LoadMasterSecret(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("big file: err = %v", err)
	}
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	if _, err := LoadMasterSecret(""); err == nil || !strings.Contains(err.Error(), "CREDENTIALS_DIRECTORY") {
		t.Fatalf("no source: err = %v", err)
	}
}
