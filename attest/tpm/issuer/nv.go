package issuer

import (
	"encoding/asn1"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/latchkey/latchkey/attest/tpm/wire"
)

// ekCertIndex is the TCG NV index of the RSA-2048 EK certificate (TCG EK
// Credential Profile, section 2.2.1.4).
const ekCertIndex = tpm2.TPMHandle(0x01c00002)

// nvChunk is the read size per TPM2_NV_Read; 512 bytes is below every
// TPM's MAX_NV_BUFFER_SIZE, so no capability query is needed.
const nvChunk = 512

// readEKCert returns the DER EK certificate from NV, or nil when the TPM
// has none (virtual TPMs often do not).
func readEKCert(tp transport.TPM) ([]byte, error) {
	pub, err := tpm2.NVReadPublic{NVIndex: ekCertIndex}.Execute(tp)
	if errors.Is(err, tpm2.TPMRCHandle) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read ek certificate index: %w", err)
	}
	nvPub, err := pub.NVPublic.Contents()
	if err != nil {
		return nil, fmt.Errorf("parse ek certificate index: %w", err)
	}
	if int(nvPub.DataSize) > wire.MaxEKCertificateSize {
		return nil, fmt.Errorf("ek certificate index holds %d bytes, more than %d", nvPub.DataSize, wire.MaxEKCertificateSize)
	}
	index := tpm2.NamedHandle{Handle: ekCertIndex, Name: pub.NVName}
	data, err := readNV(tp, tpm2.TPMRHOwner, index, nvPub.DataSize)
	if err != nil {
		// Owner authorization may be set; EK certificate indices also
		// allow reading with their own (empty) authorization.
		data, err = readNV(tp, ekCertIndex, index, nvPub.DataSize)
	}
	if err != nil {
		return nil, fmt.Errorf("read ek certificate: %w", err)
	}
	return trimDER(data)
}

func readNV(tp transport.TPM, auth tpm2.TPMHandle, index tpm2.NamedHandle, size uint16) ([]byte, error) {
	authHandle := tpm2.AuthHandle{Handle: auth, Auth: tpm2.PasswordAuth(nil)}
	if auth == index.Handle {
		authHandle.Name = index.Name
	}
	data := make([]byte, 0, size)
	for len(data) < int(size) {
		n := min(int(size)-len(data), nvChunk)
		rsp, err := tpm2.NVRead{
			AuthHandle: authHandle,
			NVIndex:    index,
			Size:       uint16(n),
			Offset:     uint16(len(data)),
		}.Execute(tp)
		if err != nil {
			return nil, err
		}
		if len(rsp.Data.Buffer) != n {
			return nil, fmt.Errorf("nv read returned %d bytes, want %d", len(rsp.Data.Buffer), n)
		}
		data = append(data, rsp.Data.Buffer...)
	}
	return data, nil
}

// trimDER cuts the padding some TPMs leave after the certificate in an NV
// index larger than it.
func trimDER(data []byte) ([]byte, error) {
	var raw asn1.RawValue
	rest, err := asn1.Unmarshal(data, &raw)
	if err != nil {
		return nil, fmt.Errorf("ek certificate is not der: %w", err)
	}
	return data[:len(data)-len(rest)], nil
}
