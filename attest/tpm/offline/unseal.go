package offline

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// Unseal releases the key if this boot satisfies g as the TPM judges it.
// A refusal wraps exactly one of the Err values, naming the bound reached
// (read from the TPM's clock and counter, so the message can say which);
// an error wrapping none of them means the TPM could not be used. Status
// is filled whenever the TPM's clock could be read.
func Unseal(tp transport.TPM, s *Sealed, g *latchkeyv1.OfflineGrant) ([]byte, Status, error) {
	if s == nil {
		return nil, Status{}, fmt.Errorf("%w: no sealed key", ErrBadGrant)
	}
	if err := s.validate(); err != nil {
		return nil, Status{}, fmt.Errorf("%w: sealed key: %v", ErrBadGrant, err)
	}
	req, pub, name, sig, err := checkGrant(g)
	if err != nil {
		return nil, Status{}, fmt.Errorf("%w: %v", ErrBadGrant, err)
	}
	if !bytes.Equal(name, s.Signer) {
		return nil, Status{}, fmt.Errorf("%w: the grant's signer is not the sealed key's (was the master secret rotated?)", ErrBadGrant)
	}
	if !bytes.Equal(req.PolicyRef, s.PolicyRef) {
		return nil, Status{}, fmt.Errorf("%w: the grant is for another machine or disk (policy ref differs)", ErrBadGrant)
	}
	clock, err := tpm2.ReadClock{}.Execute(tp)
	if err != nil {
		return nil, Status{}, fmt.Errorf("offline: read TPM clock: %w", err)
	}
	st := status(req, clock.CurrentTime.ClockInfo)
	u := unsealer{tp: tp, s: s, req: req, st: st, clock: clock.CurrentTime.ClockInfo}
	key, err := u.run(pub, name, sig)
	return key, st, err
}

// status places this boot within the grant's bounds.
func status(req GrantRequest, ci tpm2.TPMSClockInfo) Status {
	st := Status{MaxBoots: req.MaxBoots}
	if ci.ResetCount >= req.ResetCount {
		st.Boot = ci.ResetCount - req.ResetCount
	}
	if last := req.lastClock(); ci.Clock < last {
		// A TPM clock restored after a power loss can stand behind the
		// quoted one; never report more than the bound.
		st.HoursLeft = min(float64(last-ci.Clock)/msPerHour, float64(req.MaxHours))
	}
	return st
}

type unsealer struct {
	tp    transport.TPM
	s     *Sealed
	req   GrantRequest
	st    Status
	clock tpm2.TPMSClockInfo
}

// run loads the sealed object, has the TPM verify the grant's signature,
// evaluates the policy and unseals; every handle it creates is flushed.
func (u *unsealer) run(pub *tpm2.TPMTPublic, name []byte, sig *tpm2.TPMTSignature) ([]byte, error) {
	srk, err := createSRK(u.tp)
	if err != nil {
		return nil, fmt.Errorf("offline: %w", err)
	}
	defer flush(u.tp, srk.Handle)
	obj, err := u.load(srk)
	if err != nil {
		return nil, err
	}
	defer flush(u.tp, obj.Handle)
	ticket, err := u.verify(pub, sig)
	if err != nil {
		return nil, err
	}
	sess, closeSess, err := tpm2.PolicySession(u.tp, tpm2.TPMAlgSHA256, nonceSize,
		encryptSession(srk, tpm2.AESEncryption(128, tpm2.EncryptOut))...)
	if err != nil {
		return nil, fmt.Errorf("offline: start policy session: %w", err)
	}
	defer func() { _ = closeSess() }()
	if err := u.policy(sess.Handle(), name, ticket); err != nil {
		return nil, err
	}
	return u.unseal(obj, sess)
}

func (u *unsealer) load(srk *srk) (tpm2.NamedHandle, error) {
	priv, err := tpm2.Unmarshal[tpm2.TPM2BPrivate](u.s.Private)
	if err != nil {
		return tpm2.NamedHandle{}, fmt.Errorf("%w: sealed key: private area: %v", ErrBadGrant, err)
	}
	pub, err := tpm2.Unmarshal[tpm2.TPM2BPublic](u.s.Public)
	if err != nil {
		return tpm2.NamedHandle{}, fmt.Errorf("%w: sealed key: public area: %v", ErrBadGrant, err)
	}
	rsp, err := tpm2.Load{
		ParentHandle: tpm2.AuthHandle{Handle: srk.Handle, Name: srk.Name, Auth: tpm2.PasswordAuth(nil)},
		InPrivate:    *priv,
		InPublic:     *pub,
	}.Execute(u.tp)
	var rc tpm2.TPMRC
	if errors.As(err, &rc) {
		return tpm2.NamedHandle{}, fmt.Errorf("%w: the sealed key is not this TPM's or was altered (its storage root key refuses it: %v)", ErrWithdrawn, err)
	}
	if err != nil {
		return tpm2.NamedHandle{}, fmt.Errorf("offline: load sealed key: %w", err)
	}
	return tpm2.NamedHandle{Handle: rsp.ObjectHandle, Name: rsp.Name}, nil
}

// verify has the TPM check the grant's signature over
// SHA-256(approvedPolicy || policyRef), returning the ticket
// PolicyAuthorize needs. The key is loaded in the owner hierarchy: a key
// in the null hierarchy yields a null ticket PolicyAuthorize refuses.
func (u *unsealer) verify(pub *tpm2.TPMTPublic, sig *tpm2.TPMTSignature) (*tpm2.TPMTTKVerified, error) {
	key, err := tpm2.LoadExternal{
		InPublic:  tpm2.New2B(*pub),
		Hierarchy: tpm2.TPMRHOwner,
	}.Execute(u.tp)
	if err != nil {
		return nil, fmt.Errorf("offline: load grant key: %w", err)
	}
	defer flush(u.tp, key.ObjectHandle)
	rsp, err := tpm2.VerifySignature{
		KeyHandle: tpm2.NamedHandle{Handle: key.ObjectHandle, Name: key.Name},
		Digest:    tpm2.TPM2BDigest{Buffer: aHash(u.req)},
		Signature: *sig,
	}.Execute(u.tp)
	if errors.Is(err, tpm2.TPMRCSignature) {
		return nil, fmt.Errorf("%w: the signature does not cover this grant (a signed field was edited, or another key signed it)", ErrBadGrant)
	}
	if err != nil {
		return nil, fmt.Errorf("offline: verify grant signature: %w", err)
	}
	return &rsp.Validation, nil
}

// policy runs the grant's policy in the session, in the order the
// verifier hashed it, then PolicyAuthorize and PolicyNV. Each failing
// command names its bound.
func (u *unsealer) policy(sess tpm2.TPMHandle, signer []byte, ticket *tpm2.TPMTTKVerified) error {
	_, err := tpm2.PolicyPCR{
		PolicySession: sess,
		PcrDigest:     tpm2.TPM2BDigest{Buffer: pcrDigest(u.req.PCRs)},
		Pcrs:          pcrSelection(u.req.PCRs),
	}.Execute(u.tp)
	if errors.Is(err, tpm2.TPMRCValue) {
		return fmt.Errorf("%w (%s)", ErrPCRMismatch, u.pcrDiff())
	}
	if err != nil {
		return fmt.Errorf("offline: PolicyPCR: %w", err)
	}
	err = policyCounterTimer(u.tp, sess, resetOperand(u.req), offsetResetCount)
	if errors.Is(err, tpm2.TPMRCPolicy) {
		return fmt.Errorf("%w: this is boot %d since the grant, %d allowed (TPM resetCount %d)",
			ErrBootsSpent, u.st.Boot, u.req.MaxBoots, u.clock.ResetCount)
	}
	if err != nil {
		return fmt.Errorf("offline: PolicyCounterTimer (resetCount): %w", err)
	}
	err = policyCounterTimer(u.tp, sess, clockOperand(u.req), offsetClock)
	if errors.Is(err, tpm2.TPMRCPolicy) {
		return fmt.Errorf("%w: %.1f hours of TPM time since the grant, %d allowed",
			ErrExpired, float64(u.clock.Clock-min(u.clock.Clock, u.req.ClockMS))/msPerHour, u.req.MaxHours)
	}
	if err != nil {
		return fmt.Errorf("offline: PolicyCounterTimer (clock): %w", err)
	}
	if _, err := (tpm2.PolicyAuthorize{
		PolicySession:  sess,
		ApprovedPolicy: tpm2.TPM2BDigest{Buffer: approvedPolicy(u.req)},
		PolicyRef:      tpm2.TPM2BDigest{Buffer: u.req.PolicyRef},
		KeySign:        tpm2.TPM2BName{Buffer: signer},
		CheckTicket:    *ticket,
	}).Execute(u.tp); err != nil {
		return fmt.Errorf("%w: PolicyAuthorize refused the grant: %v", ErrBadGrant, err)
	}
	return u.policyNV(sess)
}

// policyNV requires the grant counter to still hold its sealing value.
func (u *unsealer) policyNV(sess tpm2.TPMHandle) error {
	index := tpm2.TPMHandle(u.s.NVIndex)
	rsp, err := tpm2.NVReadPublic{NVIndex: index}.Execute(u.tp)
	if errors.Is(err, tpm2.TPMRCHandle) {
		return fmt.Errorf("%w: the grant counter %#x is gone", ErrWithdrawn, u.s.NVIndex)
	}
	if err != nil {
		return fmt.Errorf("offline: read grant counter: %w", err)
	}
	nv := tpm2.NamedHandle{Handle: index, Name: rsp.NVName}
	_, err = tpm2.PolicyNV{
		AuthHandle:    tpm2.AuthHandle{Handle: index, Name: rsp.NVName, Auth: tpm2.PasswordAuth(nil)},
		NVIndex:       nv,
		PolicySession: sess,
		OperandB:      tpm2.TPM2BOperand{Buffer: counterOperand(u.s.Counter)},
		Operation:     tpm2.TPMEOEq,
	}.Execute(u.tp)
	switch {
	case errors.Is(err, tpm2.TPMRCPolicy):
		value, rerr := readCounter(u.tp, nv)
		if rerr != nil {
			return fmt.Errorf("%w: the grant counter moved since sealing (%v)", ErrWithdrawn, rerr)
		}
		return fmt.Errorf("%w: the grant counter is %d, sealed at %d", ErrWithdrawn, value, u.s.Counter)
	case errors.Is(err, tpm2.TPMRCNVUninitialized), errors.Is(err, tpm2.TPMRCAttributes), errors.Is(err, tpm2.TPMRCNVAuthorization):
		return fmt.Errorf("%w: the grant counter %#x was redefined (%v)", ErrWithdrawn, u.s.NVIndex, err)
	case err != nil:
		return fmt.Errorf("offline: PolicyNV: %w", err)
	}
	return nil
}

func (u *unsealer) unseal(obj tpm2.NamedHandle, sess tpm2.Session) ([]byte, error) {
	rsp, err := tpm2.Unseal{ItemHandle: tpm2.AuthHandle{Handle: obj.Handle, Name: obj.Name, Auth: sess}}.Execute(u.tp)
	if errors.Is(err, tpm2.TPMRCPolicyFail) {
		// Every step passed, so the session's digest is the one the
		// commands above produce; only the counter's name can differ from
		// what the sealed object (checked against its fields) expects.
		want, _ := counterName(u.s.NVIndex)
		got, _ := tpm2.NVReadPublic{NVIndex: tpm2.TPMHandle(u.s.NVIndex)}.Execute(u.tp)
		if got == nil || !bytes.Equal(got.NVName.Buffer, want) {
			return nil, fmt.Errorf("%w: the grant counter %#x was redefined", ErrWithdrawn, u.s.NVIndex)
		}
		return nil, fmt.Errorf("%w: the sealed object's policy refuses this grant", ErrBadGrant)
	}
	if err != nil {
		return nil, fmt.Errorf("offline: unseal: %w", err)
	}
	return rsp.OutData.Buffer, nil
}

// pcrDiff names the granted PCRs whose value differs in this boot.
func (u *unsealer) pcrDiff() string {
	var differ []uint32
	for _, i := range slices.Sorted(maps.Keys(u.req.PCRs)) {
		v, err := readPCR(u.tp, i)
		if err != nil {
			return fmt.Sprintf("PCRs unreadable: %v", err)
		}
		if !bytes.Equal(v, u.req.PCRs[i]) {
			differ = append(differ, i)
		}
	}
	return fmt.Sprintf("PCRs differing: %v", differ)
}

func readPCR(tp transport.TPM, i uint32) ([]byte, error) {
	sel := pcrSelection(map[uint32][]byte{i: nil})
	rsp, err := tpm2.PCRRead{PCRSelectionIn: sel}.Execute(tp)
	if err != nil {
		return nil, err
	}
	if len(rsp.PCRValues.Digests) != 1 {
		return nil, fmt.Errorf("PCR %d not read", i)
	}
	return rsp.PCRValues.Digests[0].Buffer, nil
}

// policyCounterTimer sends TPM2_PolicyCounterTimer (TPM 2.0 Part 3,
// 23.10), which go-tpm lacks, comparing operandB with the TPMS_TIME_INFO
// field at offset: UNSIGNED_LE, so the TPM's value must not exceed it.
func policyCounterTimer(tp transport.TPM, sess tpm2.TPMHandle, operandB []byte, offset uint16) error {
	var params []byte
	params = binary.BigEndian.AppendUint16(params, uint16(len(operandB)))
	params = append(params, operandB...)
	params = binary.BigEndian.AppendUint16(params, offset)
	params = binary.BigEndian.AppendUint16(params, uint16(tpm2.TPMEOUnsignedLE))
	return sendRaw(tp, tpm2.TPMCCPolicyCounterTimer, binary.BigEndian.AppendUint32(nil, uint32(sess)), params)
}

// sendRaw sends a command without an authorization area and returns the
// response code as a tpm2.TPMRC error.
func sendRaw(tp transport.TPM, cc tpm2.TPMCC, handles, params []byte) error {
	size := 10 + len(handles) + len(params)
	cmd := binary.BigEndian.AppendUint16(nil, uint16(tpm2.TPMSTNoSessions))
	cmd = binary.BigEndian.AppendUint32(cmd, uint32(size))
	cmd = binary.BigEndian.AppendUint32(cmd, uint32(cc))
	cmd = append(append(cmd, handles...), params...)
	rsp, err := tp.Send(cmd)
	if err != nil {
		return err
	}
	if len(rsp) < 10 {
		return fmt.Errorf("TPM response of %d bytes", len(rsp))
	}
	if rc := tpm2.TPMRC(binary.BigEndian.Uint32(rsp[6:10])); rc != tpm2.TPMRCSuccess {
		return rc
	}
	return nil
}
