package atls

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestPinOf(t *testing.T) {
	p := newTestPKI(t)
	for _, c := range []*issued{p.root, p.inter, p.leaf} {
		if got, want := PinOf(c.Cert), pinOf(t, c); got != want {
			t.Errorf("PinOf(%s) = %s, want %s", c.Cert.Subject.CommonName, got, want)
		}
	}
	if PinOf(p.leaf.Cert) == PinOf(p.inter.Cert) {
		t.Fatal("two keys share a pin")
	}
}

func TestParsePin(t *testing.T) {
	digits := strings.Repeat("0123456789abcdef", 4)
	var want Pin
	// digits decodes to 01 23 45 67 89 ab cd ef, four times.
	for i := range want {
		want[i] = []byte{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef}[i%8]
	}
	good := []struct{ name, in string }{
		{"canonical", "sha256:" + digits},
		{"upper-case digits", "sha256:" + strings.ToUpper(digits)},
		{"surrounding space", "  sha256:" + digits + "\n"},
	}
	for _, tc := range good {
		got, err := ParsePin(tc.in)
		if err != nil || got != want {
			t.Errorf("%s: ParsePin(%q) = %s, %v; want %s", tc.name, tc.in, got, err, want)
		}
	}
	if got := want.String(); got != "sha256:"+digits {
		t.Errorf("String() = %q", got)
	}
	bad := []struct{ name, in string }{
		{"empty", ""},
		{"no prefix", digits},
		{"other algorithm", "sha1:" + digits},
		{"upper-case prefix", "SHA256:" + digits},
		{"prefix alone", "sha256:"},
		{"short", "sha256:" + digits[:62]},
		{"long", "sha256:" + digits + "00"},
		{"odd length", "sha256:" + digits[:63]},
		{"not hex", "sha256:" + digits[:62] + "zz"},
		{"space inside", "sha256: " + digits},
	}
	for _, tc := range bad {
		_, err := ParsePin(tc.in)
		wantErr := "pin \"" + tc.in + "\": want sha256:<64 hex digits>"
		if err == nil || err.Error() != wantErr {
			t.Errorf("%s: ParsePin(%q) = %v, want %q", tc.name, tc.in, err, wantErr)
		}
	}
}

func TestParsePins(t *testing.T) {
	p := newTestPKI(t)
	a, b := PinOf(p.leaf.Cert), PinOf(p.root.Cert)
	got, err := ParsePins([]string{a.String(), b.String()})
	if err != nil || len(got) != 2 || got[0] != a || got[1] != b {
		t.Fatalf("ParsePins = %v, %v", got, err)
	}
	// One malformed entry refuses the whole list.
	_, err = ParsePins([]string{a.String(), ""})
	if err == nil || err.Error() != `pin "": want sha256:<64 hex digits>` {
		t.Fatalf("ParsePins with an empty entry = %v", err)
	}
}

func TestPinEqual(t *testing.T) {
	var a, b Pin
	b[31] = 1
	if !a.Equal(a) || a.Equal(b) {
		t.Fatal("Equal is wrong")
	}
}
