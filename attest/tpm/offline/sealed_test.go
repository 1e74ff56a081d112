package offline

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// testSealed builds a well-formed Sealed without a TPM: the public area
// Seal creates (with a made-up unique digest) and an opaque private area.
func testSealed(t testing.TB) *Sealed {
	t.Helper()
	a := testAuthorizer(t, testSecret(1))
	_, _, signer, _, err := checkGrant(mustGrant(t, a))
	if err != nil {
		t.Fatal(err)
	}
	ref := testRequest().PolicyRef
	nvName, err := counterName(GrantCounterIndex)
	if err != nil {
		t.Fatal(err)
	}
	pub := sealedTemplate(sealPolicy(signer, ref, nvName, 7))
	pub.Unique = tpm2.NewTPMUPublicID(tpm2.TPMAlgKeyedHash, &tpm2.TPM2BDigest{Buffer: bytes.Repeat([]byte{9}, 32)})
	return &Sealed{
		Public:    tpm2.Marshal(tpm2.New2B(pub)),
		Private:   tpm2.Marshal(tpm2.TPM2BPrivate{Buffer: bytes.Repeat([]byte{3}, 120)}),
		NVIndex:   GrantCounterIndex,
		Counter:   7,
		Signer:    signer,
		PolicyRef: ref,
	}
}

func mustGrant(t testing.TB, a *Authorizer) *latchkeyv1.OfflineGrant {
	t.Helper()
	g, err := a.Grant(testRequest())
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestSealedRoundTrip(t *testing.T) {
	s := testSealed(t)
	b, err := s.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var got Sealed
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	again, _ := got.MarshalBinary()
	if !bytes.Equal(again, b) {
		t.Error("round trip changed the encoding")
	}
}

// TestSealedRefusesEdits edits every field of an encoded Sealed, each in
// a way that keeps the rest well formed.
func TestSealedRefusesEdits(t *testing.T) {
	good, err := testSealed(t).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(s *Sealed) []byte // nil: encode s field by field
		want string
	}{
		{"magic", func(*Sealed) []byte { b := bytes.Clone(good); b[0] = 'X'; return b }, "not a latchkey sealed key"},
		{"version", func(*Sealed) []byte { b := bytes.Clone(good); b[4] = 2; return b }, "version 2, want 1"},
		{"truncated", func(*Sealed) []byte { return good[:len(good)-1] }, "truncated"},
		{"trailing byte", func(*Sealed) []byte { return append(bytes.Clone(good), 0) }, "1 trailing bytes"},
		{"oversized", func(*Sealed) []byte { return append(bytes.Clone(good), make([]byte, maxSealed)...) }, "at most 2048"},
		{"counter", func(s *Sealed) []byte { s.Counter++; return nil }, "sealed object's policy is not the one"},
		{"nv index", func(s *Sealed) []byte { s.NVIndex++; return nil }, "sealed object's policy is not the one"},
		{"nv index type", func(s *Sealed) []byte { s.NVIndex = 0x81000001; return nil }, "is not an NV index"},
		{"signer", func(s *Sealed) []byte { s.Signer[5] ^= 1; return nil }, "sealed object's policy is not the one"},
		{"signer size", func(s *Sealed) []byte { s.Signer = s.Signer[:33]; return nil }, "not a SHA-256 TPM name"},
		{"policy ref", func(s *Sealed) []byte { s.PolicyRef[0] ^= 1; return nil }, "sealed object's policy is not the one"},
		{"policy ref empty", func(s *Sealed) []byte { s.PolicyRef = nil; return nil }, "policy ref is 0 bytes"},
		{"public userWithAuth", func(s *Sealed) []byte {
			s.Public = editPublic(t, s.Public, func(p *tpm2.TPMTPublic) { p.ObjectAttributes.UserWithAuth = true })
			return nil
		}, "not a policy-only sealed object"},
		{"public policy", func(s *Sealed) []byte {
			s.Public = editPublic(t, s.Public, func(p *tpm2.TPMTPublic) { p.AuthPolicy.Buffer[0] ^= 1 })
			return nil
		}, "sealed object's policy is not the one"},
		{"public no policy", func(s *Sealed) []byte {
			s.Public = editPublic(t, s.Public, func(p *tpm2.TPMTPublic) { p.AuthPolicy.Buffer = nil })
			return nil
		}, "no SHA-256 policy"},
		{"public trailing", func(s *Sealed) []byte { s.Public = append(s.Public, 0); return nil }, "not a policy-only sealed object"},
		{"private size", func(s *Sealed) []byte { s.Private = append(s.Private, 0); return nil }, "private area size does not match"},
		{"private empty", func(s *Sealed) []byte { s.Private = nil; return nil }, "private area is 0 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testSealed(t)
			b := tc.edit(s)
			if b == nil {
				b = encodeUnchecked(s)
			}
			var got Sealed
			err := got.UnmarshalBinary(b)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			if got.Public != nil {
				t.Error("a refused decode changed the Sealed")
			}
		})
	}
}

func editPublic(t testing.TB, b []byte, edit func(*tpm2.TPMTPublic)) []byte {
	t.Helper()
	p2b, err := tpm2.Unmarshal[tpm2.TPM2BPublic](b)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := p2b.Contents()
	if err != nil {
		t.Fatal(err)
	}
	edit(pub)
	return tpm2.Marshal(tpm2.New2B(*pub))
}

// encodeUnchecked is MarshalBinary without its validation, to feed edited
// fields to UnmarshalBinary.
func encodeUnchecked(s *Sealed) []byte {
	b := append([]byte(sealedMagic), sealedVersion)
	b = binary.BigEndian.AppendUint32(b, s.NVIndex)
	b = binary.BigEndian.AppendUint64(b, s.Counter)
	for _, f := range [][]byte{s.Signer, s.PolicyRef, s.Public, s.Private} {
		b = binary.BigEndian.AppendUint16(b, uint16(len(f)))
		b = append(b, f...)
	}
	return b
}

func TestMarshalRefusesInvalidSealed(t *testing.T) {
	s := testSealed(t)
	s.Counter++
	if _, err := s.MarshalBinary(); err == nil || !strings.Contains(err.Error(), "sealed object's policy is not the one") {
		t.Fatalf("err = %v", err)
	}
}

// FuzzSealedUnmarshal: no input panics, and whatever decodes encodes back
// to the same bytes (one encoding per value).
func FuzzSealedUnmarshal(f *testing.F) {
	good, err := testSealed(f).MarshalBinary()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:20])
	f.Add([]byte(sealedMagic + "\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var s Sealed
		if err := s.UnmarshalBinary(b); err != nil {
			return
		}
		again, err := s.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded but does not encode: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatal("decoded value encodes differently")
		}
	})
}
