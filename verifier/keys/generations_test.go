package keys

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestGenerationsDeriveWithTheirOwnSecret(t *testing.T) {
	s0, s1 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	salt := []byte("salt")
	uuid := "0b7c1d6e-3f2a-4c5b-9d8e-7f6a5b4c3d2e"
	d, err := NewGenerations([]Secret{{1, s1}, {0, s0}}, 1, salt)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Current() != 1 || !d.Serves(0) || !d.Serves(1) || d.Serves(2) {
		t.Fatalf("current %d, serves 0/1/2 = %v/%v/%v", d.Current(), d.Serves(0), d.Serves(1), d.Serves(2))
	}
	for gen, secret := range map[uint32][]byte{0: s0, 1: s1} {
		got, err := d.DiskKeyAt(gen, uuid)
		if err != nil || !bytes.Equal(got, hkdfManual(secret, salt, []byte("latchkey/v1 disk "+uuid), 32)) {
			t.Fatalf("generation %d key %x, %v", gen, got, err)
		}
		one, _ := NewDeriver(secret, salt)
		if d.KeyIDAt(gen) != one.KeyID() {
			t.Fatalf("generation %d key id %s, want the single-secret id %s", gen, d.KeyIDAt(gen), one.KeyID())
		}
	}
	cur, _ := d.DiskKey(uuid)
	if want, _ := d.DiskKeyAt(1, uuid); !bytes.Equal(cur, want) {
		t.Fatal("DiskKey is not the current generation's key")
	}
	if _, err := d.DiskKeyAt(2, uuid); !errors.Is(err, ErrRetired) || !strings.Contains(err.Error(), "generation 2") {
		t.Fatalf("unserved generation: %v", err)
	}
	infos := d.Generations()
	if len(infos) != 2 || infos[0].Generation != 0 || infos[0].Current || infos[1].Generation != 1 || !infos[1].Current ||
		infos[0].KeyID == infos[1].KeyID {
		t.Fatalf("generations %+v", infos)
	}
}

func TestNewGenerationsRefuses(t *testing.T) {
	a, b := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	for _, tc := range []struct {
		name    string
		secrets []Secret
		current uint32
		want    string
	}{
		{"none", nil, 0, "no master secret"},
		{"duplicate generation", []Secret{{0, a}, {0, b}}, 0, "generation 0 is listed twice"},
		{"same bytes", []Secret{{0, a}, {1, a}}, 1, "generations 0 and 1 hold the same secret"},
		{"current missing", []Secret{{0, a}, {1, b}}, 2, "current master-secret generation 2 is not among the secrets"},
		{"short", []Secret{{3, a[:31]}}, 3, "generation 3 is 31 bytes, want at least 32"},
		{"too large", []Secret{{MaxGeneration + 1, a}}, MaxGeneration + 1, "is over"},
	} {
		if _, err := NewGenerations(tc.secrets, tc.current, []byte("s")); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
