// Package uefitest encodes the UEFI structures a firmware event log
// carries (UTF-16 strings, UEFI_VARIABLE_DATA, EFI_SIGNATURE_LIST and
// the Secure Boot variables in the order OVMF and TDVF measure them), for
// the test packages that synthesize a TPM event log (attest/tpm/tpmtest)
// and a TDX CC event log (attest/tdx/tdxtest): both firmwares log the
// same structures, only into other registers with other digests.
//
// Test-only: the shipped binaries must not link it (scripts/test.sh
// checks).
package uefitest

import (
	"bytes"
	"encoding/binary"
	"unicode/utf16"
)

// The vendor GUIDs of the variables the logs carry, as they sit in the
// log (mixed-endian EFI_GUID encoding).
var (
	// GUIDGlobal is EFI_GLOBAL_VARIABLE (SecureBoot, PK, KEK).
	GUIDGlobal = []byte{0x61, 0xdf, 0xe4, 0x8b, 0xca, 0x93, 0xd2, 0x11, 0xaa, 0x0d, 0x00, 0xe0, 0x98, 0x03, 0x2b, 0x8c}
	// GUIDImageSecurity is EFI_IMAGE_SECURITY_DATABASE_GUID (db, dbx).
	GUIDImageSecurity = []byte{0xcb, 0xb2, 0x19, 0xd7, 0x3a, 0x3d, 0x96, 0x45, 0xa3, 0xbc, 0xda, 0xd0, 0x0e, 0x67, 0x65, 0x6f}
	// GUIDCertX509 is EFI_CERT_X509_GUID, a signature list's type.
	GUIDCertX509 = []byte{0xa1, 0x59, 0xc0, 0xa5, 0xe4, 0x94, 0xa7, 0x4a, 0x87, 0xb5, 0xab, 0x15, 0x5c, 0x2b, 0xf0, 0x72}
)

// UTF16 encodes s as UTF-16LE with a NUL, as EFI code logs strings.
func UTF16(s string) []byte {
	var b []byte
	for _, u := range utf16.Encode([]rune(s + "\x00")) {
		b = binary.LittleEndian.AppendUint16(b, u)
	}
	return b
}

// Variable encodes UEFI_VARIABLE_DATA.
func Variable(guid []byte, name string, data []byte) []byte {
	var b bytes.Buffer
	b.Write(guid)
	u := utf16.Encode([]rune(name))
	binary.Write(&b, binary.LittleEndian, uint64(len(u)))
	binary.Write(&b, binary.LittleEndian, uint64(len(data)))
	binary.Write(&b, binary.LittleEndian, u)
	b.Write(data)
	return b.Bytes()
}

// SignatureList encodes an EFI_SIGNATURE_LIST per X.509 certificate (one
// list per certificate, as OVMF's enrolment tools write them).
func SignatureList(certs [][]byte) []byte {
	var b bytes.Buffer
	for _, der := range certs {
		b.Write(GUIDCertX509)
		binary.Write(&b, binary.LittleEndian, uint32(28+16+len(der)))
		binary.Write(&b, binary.LittleEndian, uint32(0))
		binary.Write(&b, binary.LittleEndian, uint32(16+len(der)))
		b.Write(make([]byte, 16)) // owner
		b.Write(der)
	}
	return b.Bytes()
}

// SecureBootVariables are the EV_EFI_VARIABLE_DRIVER_CONFIG payloads the
// firmware measures before its separator, in its order: SecureBoot, PK,
// KEK, db, dbx. The test PKI is one certificate list: PK, KEK and db
// hold the same.
func SecureBootVariables(secureBoot bool, db [][]byte) [][]byte {
	sb := byte(0)
	if secureBoot {
		sb = 1
	}
	return [][]byte{
		Variable(GUIDGlobal, "SecureBoot", []byte{sb}),
		Variable(GUIDGlobal, "PK", SignatureList(db)),
		Variable(GUIDGlobal, "KEK", SignatureList(db)),
		Variable(GUIDImageSecurity, "db", SignatureList(db)),
		Variable(GUIDImageSecurity, "dbx", nil),
	}
}

// Authority is the EV_EFI_VARIABLE_AUTHORITY payload naming the db
// certificate der that verified an image (an EFI_SIGNATURE_DATA: owner
// GUID, then the certificate).
func Authority(der []byte) []byte {
	return Variable(GUIDImageSecurity, "db", append(make([]byte, 16), der...))
}

// SpecIDEvent is a crypto-agile log's first event: the SHA-1-format
// EV_NO_ACTION header carrying TCG_EfiSpecIDEvent, naming one digest
// algorithm (alg, a TPM_ALG_ID) of size bytes.
func SpecIDEvent(alg uint16, size uint16) []byte {
	var spec bytes.Buffer
	spec.WriteString("Spec ID Event03\x00")
	binary.Write(&spec, binary.LittleEndian, struct {
		PlatformClass                   uint32
		Minor, Major, Errata, UintnSize uint8
		NumAlgs                         uint32
		AlgID, AlgSize                  uint16
		VendorInfoSize                  uint8
	}{0, 0, 2, 0, 2, 1, alg, size, 0})
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, struct {
		PCR, Type uint32
		Digest    [20]byte
		Size      uint32
	}{0, evNoAction, [20]byte{}, uint32(spec.Len())})
	b.Write(spec.Bytes())
	return b.Bytes()
}

// evNoAction is EV_NO_ACTION.
const evNoAction = 0x03
