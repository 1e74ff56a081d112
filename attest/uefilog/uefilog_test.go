package uefilog

import (
	"crypto"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/binary"
	"strings"
	"testing"
	"unicode/utf16"
)

func utf16z(s string) []byte {
	var b []byte
	for _, c := range utf16.Encode([]rune(s + "\x00")) {
		b = binary.LittleEndian.AppendUint16(b, c)
	}
	return b
}

// A section name is read from UTF-16 or ASCII data only when the name
// with its NUL hashes, under the register's hash, to the digest.
func TestSectionName(t *testing.T) {
	d384 := sha512.Sum384([]byte(".linux\x00"))
	if name, ok := SectionName(crypto.SHA384, utf16z(".linux"), d384[:]); !ok || name != ".linux" {
		t.Fatalf("utf-16 name: %q %v", name, ok)
	}
	if name, ok := SectionName(crypto.SHA384, []byte(".linux\x00"), d384[:]); !ok || name != ".linux" {
		t.Fatalf("ascii name: %q %v", name, ok)
	}
	d256 := sha256.Sum256([]byte(".linux\x00"))
	if _, ok := SectionName(crypto.SHA384, utf16z(".linux"), d256[:]); ok {
		t.Fatal("a sha-256 digest read as a sha-384 section name")
	}
	if _, ok := SectionName(crypto.SHA384, utf16z(".initrd"), d384[:]); ok {
		t.Fatal("data naming another section read as this digest's name")
	}
}

// The structure digests are the actions and separators under the hash,
// and nothing else.
func TestStructure(t *testing.T) {
	s := NewStructure(crypto.SHA384)
	for _, b := range [][]byte{[]byte(CallingApp), []byte(ExitBootServicesOK), {0, 0, 0, 0}, {0xff, 0xff, 0xff, 0xff}} {
		d := sha512.Sum384(b)
		if !s.Is(d[:]) {
			t.Errorf("%q is not structure", b)
		}
	}
	ret := sha512.Sum384([]byte(ReturningApp))
	if s.Returning != string(ret[:]) {
		t.Error("Returning is not the digest of ReturningApp")
	}
	d := sha256.Sum256([]byte(CallingApp))
	if s.Is(d[:]) {
		t.Error("a sha-256 action digest is sha-384 structure")
	}
}

func TestParseDigests(t *testing.T) {
	good := "sha384:" + strings.Repeat("ab", 48)
	if ds, err := ParseDigests("boot.ukis", "sha384", 48, []string{good}); err != nil || len(ds) != 1 || ds[0][0] != 0xab {
		t.Fatalf("ParseDigests: %v %v", ds, err)
	}
	for _, bad := range []string{"sha256:" + strings.Repeat("ab", 48), "sha384:" + strings.Repeat("AB", 48), "sha384:" + strings.Repeat("ab", 32), strings.Repeat("ab", 48)} {
		_, err := ParseDigests("boot.ukis", "sha384", 48, []string{good, bad})
		if err == nil || !strings.HasPrefix(err.Error(), "boot.ukis[1]: ") || !strings.HasSuffix(err.Error(), "is not sha384:<96 lower-case hex digits>") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
