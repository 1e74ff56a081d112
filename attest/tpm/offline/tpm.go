package offline

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// nonceSize of the policy session (SHA-256's digest size).
const nonceSize = 32

// Seal seals key under tp's storage root key for grants signed like g
// (same signer, same policy ref), defining the grant counter if needed.
// It checks g's signature first, so it never seals a key that g cannot
// open.
func Seal(tp transport.TPM, key []byte, g *latchkeyv1.OfflineGrant) (*Sealed, error) {
	if len(key) < minKey || len(key) > maxKey {
		return nil, fmt.Errorf("offline: seal: key is %d bytes, want %d to %d", len(key), minKey, maxKey)
	}
	req, pub, name, sig, err := checkGrant(g)
	if err != nil {
		return nil, fmt.Errorf("offline: seal: %w", err)
	}
	if err := verifyInGo(pub, sig, aHash(req)); err != nil {
		return nil, fmt.Errorf("offline: seal: %w", err)
	}
	nv, value, err := ensureCounter(tp, GrantCounterIndex)
	if err != nil {
		return nil, fmt.Errorf("offline: seal: grant counter: %w", err)
	}
	srk, err := createSRK(tp)
	if err != nil {
		return nil, fmt.Errorf("offline: seal: %w", err)
	}
	defer flush(tp, srk.Handle)
	enc := tpm2.HMAC(tpm2.TPMAlgSHA256, nonceSize, encryptSession(srk, tpm2.AESEncryption(128, tpm2.EncryptIn))...)
	rsp, err := tpm2.Create{
		ParentHandle: tpm2.AuthHandle{Handle: srk.Handle, Name: srk.Name, Auth: tpm2.PasswordAuth(nil)},
		InSensitive: tpm2.TPM2BSensitiveCreate{Sensitive: &tpm2.TPMSSensitiveCreate{
			Data: tpm2.NewTPMUSensitiveCreate(&tpm2.TPM2BSensitiveData{Buffer: key}),
		}},
		InPublic: tpm2.New2B(sealedTemplate(sealPolicy(name, req.PolicyRef, nv.Name.Buffer, value))),
	}.Execute(tp, enc)
	if err != nil {
		return nil, fmt.Errorf("offline: seal: create sealed object: %w", err)
	}
	return &Sealed{
		Public:    tpm2.Marshal(rsp.OutPublic),
		Private:   tpm2.Marshal(rsp.OutPrivate),
		NVIndex:   GrantCounterIndex,
		Counter:   value,
		Signer:    name,
		PolicyRef: bytes.Clone(req.PolicyRef),
	}, nil
}

// verifyInGo checks a grant's signature without a TPM.
func verifyInGo(pub *tpm2.TPMTPublic, sig *tpm2.TPMTSignature, digest []byte) error {
	point, _ := pub.Unique.ECC()
	key, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(),
		append(append([]byte{4}, point.X.Buffer...), point.Y.Buffer...))
	if err != nil {
		return err
	}
	ecc, _ := sig.Signature.ECDSA()
	r := new(big.Int).SetBytes(ecc.SignatureR.Buffer)
	s := new(big.Int).SetBytes(ecc.SignatureS.Buffer)
	if !ecdsa.Verify(key, digest, r, s) {
		return errors.New("grant signature does not verify")
	}
	return nil
}

// ensureCounter returns the grant counter at index and its value,
// defining it (and counting it once, so it can be read) when absent. An
// index of another shape at that handle is refused, never replaced: it is
// not latchkey's to delete.
func ensureCounter(tp transport.TPM, index uint32) (tpm2.NamedHandle, uint64, error) {
	rsp, err := tpm2.NVReadPublic{NVIndex: tpm2.TPMHandle(index)}.Execute(tp)
	if errors.Is(err, tpm2.TPMRCHandle) {
		if _, err := (tpm2.NVDefineSpace{
			AuthHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
			PublicInfo: tpm2.New2B(counterPublic(index, false)),
		}).Execute(tp); err != nil {
			return tpm2.NamedHandle{}, 0, fmt.Errorf("define %#x: %w", index, err)
		}
		rsp, err = tpm2.NVReadPublic{NVIndex: tpm2.TPMHandle(index)}.Execute(tp)
	}
	if err != nil {
		return tpm2.NamedHandle{}, 0, fmt.Errorf("read public of %#x: %w", index, err)
	}
	pub, err := rsp.NVPublic.Contents()
	if err != nil {
		return tpm2.NamedHandle{}, 0, err
	}
	nv := tpm2.NamedHandle{Handle: tpm2.TPMHandle(index), Name: rsp.NVName}
	if !pub.Attributes.Written {
		if err := increment(tp, nv); err != nil {
			return tpm2.NamedHandle{}, 0, err
		}
		rsp, err = tpm2.NVReadPublic{NVIndex: tpm2.TPMHandle(index)}.Execute(tp)
		if err != nil {
			return tpm2.NamedHandle{}, 0, fmt.Errorf("read public of %#x: %w", index, err)
		}
		nv.Name = rsp.NVName
	}
	want, err := counterName(index)
	if err != nil {
		return tpm2.NamedHandle{}, 0, err
	}
	if !bytes.Equal(nv.Name.Buffer, want) {
		return tpm2.NamedHandle{}, 0, fmt.Errorf("NV index %#x exists and is not a latchkey grant counter; refusing to use or replace it", index)
	}
	value, err := readCounter(tp, nv)
	return nv, value, err
}

func increment(tp transport.TPM, nv tpm2.NamedHandle) error {
	_, err := tpm2.NVIncrement{
		AuthHandle: tpm2.AuthHandle{Handle: nv.Handle, Name: nv.Name, Auth: tpm2.PasswordAuth(nil)},
		NVIndex:    nv,
	}.Execute(tp)
	if err != nil {
		return fmt.Errorf("increment %#x: %w", uint32(nv.Handle), err)
	}
	return nil
}

func readCounter(tp transport.TPM, nv tpm2.NamedHandle) (uint64, error) {
	rsp, err := tpm2.NVRead{
		AuthHandle: tpm2.AuthHandle{Handle: nv.Handle, Name: nv.Name, Auth: tpm2.PasswordAuth(nil)},
		NVIndex:    nv,
		Size:       8,
	}.Execute(tp)
	if err != nil {
		return 0, fmt.Errorf("read %#x: %w", uint32(nv.Handle), err)
	}
	if len(rsp.Data.Buffer) != 8 {
		return 0, fmt.Errorf("read %#x: %d bytes, want 8", uint32(nv.Handle), len(rsp.Data.Buffer))
	}
	return binary.BigEndian.Uint64(rsp.Data.Buffer), nil
}

// srk is the storage root key: its handle and name, and its public area
// for salting sessions.
type srk struct {
	tpm2.NamedHandle
	public tpm2.TPMTPublic
}

// createSRK makes the storage root key from the TCG ECC P-256 template:
// the same key every time on one TPM (the owner seed does not change),
// so nothing needs to be persisted.
func createSRK(tp transport.TPM) (*srk, error) {
	rsp, err := tpm2.CreatePrimary{
		PrimaryHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
		InPublic:      tpm2.New2B(tpm2.ECCSRKTemplate),
	}.Execute(tp)
	if err != nil {
		return nil, fmt.Errorf("create storage root key: %w", err)
	}
	pub, err := rsp.OutPublic.Contents()
	if err != nil {
		flush(tp, rsp.ObjectHandle)
		return nil, fmt.Errorf("storage root key: %w", err)
	}
	return &srk{NamedHandle: tpm2.NamedHandle{Handle: rsp.ObjectHandle, Name: rsp.Name}, public: *pub}, nil
}

// encryptSession is a session salted to the SRK that encrypts the first
// parameter of a command (dir EncryptIn) or response (EncryptOut), so the
// disk key never crosses the bus to the TPM in clear.
func encryptSession(k *srk, dir tpm2.AuthOption) []tpm2.AuthOption {
	return []tpm2.AuthOption{tpm2.Salted(k.Handle, k.public), dir}
}

func flush(tp transport.TPM, h tpm2.TPMHandle) {
	_, _ = tpm2.FlushContext{FlushHandle: h}.Execute(tp)
}

// Withdraw increments the grant counter: every copy of s stops opening.
// A counter that is gone needs nothing: a TPM never starts a new counter
// below any value an old one held.
func Withdraw(tp transport.TPM, s *Sealed) error {
	if s == nil || s.NVIndex>>24 != nvIndexType {
		return errors.New("offline: withdraw: no grant counter")
	}
	rsp, err := tpm2.NVReadPublic{NVIndex: tpm2.TPMHandle(s.NVIndex)}.Execute(tp)
	if errors.Is(err, tpm2.TPMRCHandle) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("offline: withdraw: read public of %#x: %w", s.NVIndex, err)
	}
	want, err := counterName(s.NVIndex)
	if err != nil {
		return err
	}
	if !bytes.Equal(rsp.NVName.Buffer, want) {
		// Not (or no longer) a written grant counter: s cannot open.
		return nil
	}
	if err := increment(tp, tpm2.NamedHandle{Handle: tpm2.TPMHandle(s.NVIndex), Name: rsp.NVName}); err != nil {
		return fmt.Errorf("offline: withdraw: %w", err)
	}
	return nil
}
