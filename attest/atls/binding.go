// Package atls binds attestation evidence to one TLS 1.3 session and
// authenticates the verifier to the agent by SPKI pin.
//
// The binding is what makes evidence worthless anywhere but on the session
// it was made for: its user data is
//
//	SHA-256( "latchkey/v1 attestation binding" 0x00
//	         || lp(exporter) || lp(node_name) || lp(disk_uuid)
//	         || u32(role) || u8(rejoin) || u8(request_token) || u32(variant)
//	         [ || u32(purpose) ] )
//
// where exporter is the session's RFC 8446 exported keying material for the
// label EXPORTER-latchkey-attestation (32 bytes, empty context), lp(x) is x
// prefixed with its big-endian uint32 length and u32/u8 are big-endian
// integers. u32(purpose) is appended only when the Hello's purpose is not
// PURPOSE_UNSPECIFIED, so the binding of a Hello from an agent that
// predates the field is unchanged (and a re-attestation's evidence can
// never pass as a join's, nor the reverse). Evidence replayed on another session, relayed through a
// TLS-terminating proxy (which holds two sessions with two exporters), or
// sent with an edited Hello field no longer matches. The binding is 32
// bytes, which fits TPM qualifying data on every TPM; SNP carries it in the
// first half of REPORT_DATA and zeros in the second.
package atls

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// ExporterLabel is the RFC 5705/8446 exporter label of the binding.
const ExporterLabel = "EXPORTER-latchkey-attestation"

const (
	bindingLabel = "latchkey/v1 attestation binding"
	exporterSize = 32
)

// Exporter returns this session's exported keying material for the binding.
// It refuses anything but TLS 1.3, whose exporter is bound to the full
// handshake transcript.
func Exporter(cs *tls.ConnectionState) ([]byte, error) {
	if cs == nil || !cs.HandshakeComplete {
		return nil, errors.New("tls handshake not complete")
	}
	if cs.Version != tls.VersionTLS13 {
		return nil, fmt.Errorf("tls version %#04x is not TLS 1.3", cs.Version)
	}
	ekm, err := cs.ExportKeyingMaterial(ExporterLabel, nil, exporterSize)
	if err != nil {
		return nil, fmt.Errorf("export keying material: %w", err)
	}
	return ekm, nil
}

// Binding computes the user data evidence must carry for hello on the
// session whose exporter value is given. hello.Evidence is not covered (the
// evidence contains the binding).
func Binding(exporter []byte, hello *latchkeyv1.Hello) []byte {
	h := sha256.New()
	h.Write([]byte(bindingLabel))
	h.Write([]byte{0})
	writeLP(h, exporter)
	writeLP(h, []byte(hello.GetNodeName()))
	writeLP(h, []byte(hello.GetDiskUuid()))
	var buf [10]byte
	binary.BigEndian.PutUint32(buf[0:4], uint32(hello.GetRole()))
	buf[4] = boolByte(hello.GetRejoin())
	buf[5] = boolByte(hello.GetRequestToken())
	binary.BigEndian.PutUint32(buf[6:10], uint32(hello.GetVariant()))
	h.Write(buf[:])
	if p := hello.GetPurpose(); p != latchkeyv1.Purpose_PURPOSE_UNSPECIFIED {
		var pb [4]byte
		binary.BigEndian.PutUint32(pb[:], uint32(p))
		h.Write(pb[:])
	}
	return h.Sum(nil)
}

// SessionBinding is Exporter followed by Binding.
func SessionBinding(cs *tls.ConnectionState, hello *latchkeyv1.Hello) ([]byte, error) {
	ekm, err := Exporter(cs)
	if err != nil {
		return nil, err
	}
	return Binding(ekm, hello), nil
}

func writeLP(h interface{ Write([]byte) (int, error) }, b []byte) {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(b)))
	h.Write(n[:])
	h.Write(b)
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}
