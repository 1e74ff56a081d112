package offline

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/google/go-tpm/tpm2"
)

const (
	// numPCRs is the PC Client PCR count; a selection is three octets.
	numPCRs = 24
	// Offsets in the marshalled TPMS_TIME_INFO (TPM 2.0 Part 2, 10.11.6):
	// time (UINT64), then TPMS_CLOCK_INFO: clock (UINT64), resetCount
	// (UINT32), restartCount (UINT32), safe (BYTE).
	offsetClock      = 8
	offsetResetCount = 16
	msPerHour        = 3600 * 1000
)

// check validates a request's every field: sizes, PCR indices and
// values, bounds within the limits and no bound that overflows.
func (r GrantRequest) check() error {
	if len(r.PolicyRef) == 0 || len(r.PolicyRef) > MaxPolicyRef {
		return fmt.Errorf("policy ref is %d bytes, want 1 to %d", len(r.PolicyRef), MaxPolicyRef)
	}
	if len(r.PCRs) == 0 {
		return fmt.Errorf("no PCR values: a grant binds the boot's measurements")
	}
	for i, v := range r.PCRs {
		if i >= numPCRs {
			return fmt.Errorf("PCR %d out of range (0-%d)", i, numPCRs-1)
		}
		if len(v) != sha256.Size {
			return fmt.Errorf("PCR %d value is %d bytes, want %d (SHA-256)", i, len(v), sha256.Size)
		}
	}
	if r.MaxBoots < 1 || r.MaxBoots > MaxBootsLimit {
		return fmt.Errorf("max boots %d outside 1-%d", r.MaxBoots, MaxBootsLimit)
	}
	if r.MaxHours < 1 || r.MaxHours > MaxHoursLimit {
		return fmt.Errorf("max hours %d outside 1-%d", r.MaxHours, MaxHoursLimit)
	}
	if uint64(r.ResetCount)+uint64(r.MaxBoots) > math.MaxUint32 {
		return fmt.Errorf("reset count %d + max boots %d overflows", r.ResetCount, r.MaxBoots)
	}
	if r.ClockMS > math.MaxUint64-uint64(r.MaxHours)*msPerHour {
		return fmt.Errorf("clock %d ms + max hours %d overflows", r.ClockMS, r.MaxHours)
	}
	return nil
}

func (r GrantRequest) lastResetCount() uint32 { return r.ResetCount + r.MaxBoots }
func (r GrantRequest) lastClock() uint64      { return r.ClockMS + uint64(r.MaxHours)*msPerHour }

// pcrSelection selects the request's PCRs of the SHA-256 bank.
func pcrSelection(pcrs map[uint32][]byte) tpm2.TPMLPCRSelection {
	bitmap := make([]byte, numPCRs/8)
	for i := range pcrs {
		bitmap[i/8] |= 1 << (i % 8)
	}
	return tpm2.TPMLPCRSelection{PCRSelections: []tpm2.TPMSPCRSelection{
		{Hash: tpm2.TPMAlgSHA256, PCRSelect: bitmap},
	}}
}

// pcrDigest is the digest PolicyPCR compares: SHA-256 over the selected
// values in ascending PCR order.
func pcrDigest(pcrs map[uint32][]byte) []byte {
	h := sha256.New()
	for _, i := range slices.Sorted(maps.Keys(pcrs)) {
		h.Write(pcrs[i])
	}
	return h.Sum(nil)
}

// extend is one policy command's update of a policy digest (TPM 2.0
// Part 3, 23): digest' = H(digest || commandCode || parts...).
func extend(digest []byte, cc tpm2.TPMCC, parts ...[]byte) []byte {
	h := sha256.New()
	h.Write(digest)
	h.Write(binary.BigEndian.AppendUint32(nil, uint32(cc)))
	for _, p := range parts {
		h.Write(p)
	}
	return h.Sum(nil)
}

// operandArgs is the args digest of PolicyNV and PolicyCounterTimer:
// H(operandB || offset || operation).
func operandArgs(operandB []byte, offset uint16, op tpm2.TPMEO) []byte {
	h := sha256.New()
	h.Write(operandB)
	h.Write(binary.BigEndian.AppendUint16(nil, offset))
	h.Write(binary.BigEndian.AppendUint16(nil, uint16(op)))
	return h.Sum(nil)
}

// resetOperand and clockOperand are the PolicyCounterTimer operands of a
// request: big-endian, the width of the TPMS_TIME_INFO field compared.
func resetOperand(r GrantRequest) []byte {
	return binary.BigEndian.AppendUint32(nil, r.lastResetCount())
}
func clockOperand(r GrantRequest) []byte { return binary.BigEndian.AppendUint64(nil, r.lastClock()) }

// approvedPolicy is the policy digest the grant key signs: PolicyPCR,
// then the boot bound, then the time bound. Unseal runs the same commands
// in the same order, so the digests agree only if every bound holds.
func approvedPolicy(r GrantRequest) []byte {
	d := make([]byte, sha256.Size)
	sel := tpm2.Marshal(pcrSelection(r.PCRs))
	d = extend(d, tpm2.TPMCCPolicyPCR, sel, pcrDigest(r.PCRs))
	d = extend(d, tpm2.TPMCCPolicyCounterTimer, operandArgs(resetOperand(r), offsetResetCount, tpm2.TPMEOUnsignedLE))
	d = extend(d, tpm2.TPMCCPolicyCounterTimer, operandArgs(clockOperand(r), offsetClock, tpm2.TPMEOUnsignedLE))
	return d
}

// aHash is what the grant key signs (TPM 2.0 Part 3, 23.16):
// SHA-256(approvedPolicy || policyRef).
func aHash(r GrantRequest) []byte {
	h := sha256.New()
	h.Write(approvedPolicy(r))
	h.Write(r.PolicyRef)
	return h.Sum(nil)
}

// counterOperand is the PolicyNV operand: the counter's 8 octets.
func counterOperand(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// sealPolicy is the sealed object's authPolicy: PolicyAuthorize(signer,
// ref) (which resets the digest before extending it) then PolicyNV(the
// counter == value).
func sealPolicy(signer, ref []byte, counterName []byte, value uint64) []byte {
	d := make([]byte, sha256.Size)
	d = extend(d, tpm2.TPMCCPolicyAuthorize, signer)
	h := sha256.New()
	h.Write(d)
	h.Write(ref)
	d = h.Sum(nil)
	return extend(d, tpm2.TPMCCPolicyNV, operandArgs(counterOperand(value), 0, tpm2.TPMEOEq), counterName)
}

// counterPublic is the grant counter's NV public area once written: a
// counter the owner or anyone (empty auth) may read, so PolicyNV can, and
// increment, so an agent can always withdraw; NoDA so no failure locks
// the TPM out.
func counterPublic(index uint32, written bool) tpm2.TPMSNVPublic {
	return tpm2.TPMSNVPublic{
		NVIndex: tpm2.TPMHandle(index),
		NameAlg: tpm2.TPMAlgSHA256,
		Attributes: tpm2.TPMANV{
			NT:         tpm2.TPMNTCounter,
			AuthWrite:  true,
			OwnerWrite: true,
			AuthRead:   true,
			OwnerRead:  true,
			NoDA:       true,
			Written:    written,
		},
		DataSize: 8,
	}
}

// counterName is the TPM name of the written grant counter at index.
func counterName(index uint32) ([]byte, error) {
	pub := counterPublic(index, true)
	n, err := tpm2.NVName(&pub)
	if err != nil {
		return nil, err
	}
	return n.Buffer, nil
}
