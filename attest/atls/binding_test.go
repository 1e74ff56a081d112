package atls

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// bindingVector is one known answer for Binding. The preimage is written out
// field by field from the byte layout in docs/architecture.md ("Attested
// TLS"), and digest is its SHA-256 computed outside Go (Python's hashlib),
// so neither depends on the code under test.
type bindingVector struct {
	name     string
	exporter []byte
	hello    *latchkeyv1.Hello
	preimage []string // hex, one element per field of the layout
	digest   string
}

// labelHex is "latchkey/v1 attestation binding" followed by its 0x00.
const labelHex = "6c617463686b65792f7631206174746573746174696f6e2062696e64696e67" + "00"

var bindingVectors = []bindingVector{
	{
		name:     "worker first join, TPM",
		exporter: seq(32),
		hello: &latchkeyv1.Hello{
			NodeName: "node-1",
			DiskUuid: "0d5f3c9e-7a41-4b8e-9c2d-5e6f7a8b9c0d",
			Role:     latchkeyv1.Role_ROLE_WORKER,
			Variant:  latchkeyv1.Variant_VARIANT_TPM,
		},
		preimage: []string{
			labelHex,
			"00000020", "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
			"00000006", "6e6f64652d31",
			"00000024", "30643566336339652d376134312d346238652d396332642d356536663761386239633064",
			"00000001", // role
			"00",       // rejoin
			"00",       // request_token
			"00000001", // variant
		},
		digest: "936c01b863a02a7313d6af40523a36fc83c70bfe86183a9ffb24daf69a0fbd52",
	},
	{
		name:     "control-plane rejoin asking for a token, SNP",
		exporter: bytes.Repeat([]byte{0xff}, 32),
		hello: &latchkeyv1.Hello{
			NodeName:     "cp-0.example.com",
			DiskUuid:     "f47ac10b-58cc-4372-a567-0e02b2c3d479",
			Role:         latchkeyv1.Role_ROLE_CONTROL_PLANE,
			Rejoin:       true,
			RequestToken: true,
			Variant:      latchkeyv1.Variant_VARIANT_SNP,
			// Evidence is not covered by the binding.
			Evidence: []byte("ignored"),
		},
		preimage: []string{
			labelHex,
			"00000020", strings.Repeat("ff", 32),
			"00000010", "63702d302e6578616d706c652e636f6d",
			"00000024", "66343761633130622d353863632d343337322d613536372d306530326232633364343739",
			"00000002",
			"01",
			"01",
			"00000002",
		},
		digest: "a40c6824aa6cc5b8407a56df0a517765cb5bf9eae5630582f5256b8d06b6b812",
	},
	{
		name:     "worker re-attestation, TPM (purpose appended)",
		exporter: seq(32),
		hello: &latchkeyv1.Hello{
			NodeName: "node-1",
			DiskUuid: "0d5f3c9e-7a41-4b8e-9c2d-5e6f7a8b9c0d",
			Role:     latchkeyv1.Role_ROLE_WORKER,
			Rejoin:   true,
			Variant:  latchkeyv1.Variant_VARIANT_TPM,
			Purpose:  latchkeyv1.Purpose_PURPOSE_REATTEST,
		},
		preimage: []string{
			labelHex,
			"00000020", "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
			"00000006", "6e6f64652d31",
			"00000024", "30643566336339652d376134312d346238652d396332642d356536663761386239633064",
			"00000001", // role
			"01",       // rejoin
			"00",       // request_token
			"00000001", // variant
			"00000002", // purpose: PURPOSE_REATTEST
		},
		digest: "6b98e74e3206724cba076c94d7e6872c151e9c8bc6cf366d8e3c5c3885598700",
	},
	{
		name:     "explicit PURPOSE_JOIN is appended (differs from unspecified)",
		exporter: seq(32),
		hello: &latchkeyv1.Hello{
			NodeName: "node-1",
			DiskUuid: "0d5f3c9e-7a41-4b8e-9c2d-5e6f7a8b9c0d",
			Role:     latchkeyv1.Role_ROLE_WORKER,
			Variant:  latchkeyv1.Variant_VARIANT_TPM,
			Purpose:  latchkeyv1.Purpose_PURPOSE_JOIN,
		},
		preimage: []string{
			labelHex,
			"00000020", "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
			"00000006", "6e6f64652d31",
			"00000024", "30643566336339652d376134312d346238652d396332642d356536663761386239633064",
			"00000001", "00", "00", "00000001",
			"00000001", // purpose: PURPOSE_JOIN
		},
		digest: "44cd88bc0b1e8a6a8e95696a2cbe1c364900c9e14b0868c22f8104e90971c6a3",
	},
	{
		name:     "everything empty (nil hello)",
		exporter: nil,
		hello:    nil,
		preimage: []string{
			labelHex,
			"00000000",
			"00000000",
			"00000000",
			"00000000",
			"00",
			"00",
			"00000000",
		},
		digest: "747ed5ef476dd2a8a7e8a8e5bd89c453c1b2712a0ce281d31674b32788944c3f",
	},
}

func seq(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

func TestBindingKnownAnswers(t *testing.T) {
	for _, v := range bindingVectors {
		t.Run(v.name, func(t *testing.T) {
			pre, err := hex.DecodeString(strings.Join(v.preimage, ""))
			if err != nil {
				t.Fatalf("vector preimage: %v", err)
			}
			want, err := hex.DecodeString(v.digest)
			if err != nil {
				t.Fatalf("vector digest: %v", err)
			}
			// The vector is self-consistent: its digest is the SHA-256 of
			// the layout written out above.
			if sum := sha256.Sum256(pre); !bytes.Equal(sum[:], want) {
				t.Fatalf("vector broken: sha256(preimage) = %x, digest %x", sum, want)
			}
			got := Binding(v.exporter, v.hello)
			if !bytes.Equal(got, want) {
				t.Fatalf("Binding = %x, want %x", got, want)
			}
		})
	}
}

// TestBindingCoversEveryHelloField edits one field at a time and expects a
// different binding: an edited Hello must not carry over a binding.
func TestBindingCoversEveryHelloField(t *testing.T) {
	base := func() *latchkeyv1.Hello {
		return &latchkeyv1.Hello{
			NodeName: "node-1",
			DiskUuid: "0d5f3c9e-7a41-4b8e-9c2d-5e6f7a8b9c0d",
			Role:     latchkeyv1.Role_ROLE_WORKER,
			Variant:  latchkeyv1.Variant_VARIANT_TPM,
		}
	}
	exporter := seq(32)
	ref := Binding(exporter, base())
	edits := map[string]func(h *latchkeyv1.Hello) []byte{
		"exporter":      func(h *latchkeyv1.Hello) []byte { e := seq(32); e[31] ^= 1; return e },
		"node_name":     func(h *latchkeyv1.Hello) []byte { h.NodeName = "node-2"; return exporter },
		"disk_uuid":     func(h *latchkeyv1.Hello) []byte { h.DiskUuid = "0d5f3c9e-7a41-4b8e-9c2d-5e6f7a8b9c0e"; return exporter },
		"role":          func(h *latchkeyv1.Hello) []byte { h.Role = latchkeyv1.Role_ROLE_CONTROL_PLANE; return exporter },
		"rejoin":        func(h *latchkeyv1.Hello) []byte { h.Rejoin = true; return exporter },
		"request_token": func(h *latchkeyv1.Hello) []byte { h.RequestToken = true; return exporter },
		"variant":       func(h *latchkeyv1.Hello) []byte { h.Variant = latchkeyv1.Variant_VARIANT_SNP; return exporter },
		"purpose":       func(h *latchkeyv1.Hello) []byte { h.Purpose = latchkeyv1.Purpose_PURPOSE_REATTEST; return exporter },
		// Moving a byte from one length-prefixed field to the next must
		// change the binding too (that is what the prefixes are for).
		"boundary": func(h *latchkeyv1.Hello) []byte {
			h.NodeName, h.DiskUuid = "node-10", "d5f3c9e-7a41-4b8e-9c2d-5e6f7a8b9c0d"
			return exporter
		},
	}
	for name, edit := range edits {
		h := base()
		e := edit(h)
		if got := Binding(e, h); bytes.Equal(got, ref) {
			t.Errorf("editing %s left the binding unchanged (%x)", name, got)
		}
	}
	if got := Binding(exporter, base()); !bytes.Equal(got, ref) {
		t.Fatalf("Binding is not deterministic: %x then %x", ref, got)
	}
}
