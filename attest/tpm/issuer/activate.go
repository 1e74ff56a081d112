package issuer

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
	"google.golang.org/protobuf/proto"

	"github.com/latchkey/latchkey/attest/tpm/wire"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// Respond answers the verifier's credential challenge (a serialized
// TPMChallenge) with TPM2_ActivateCredential: the TPM releases the secret
// only if it holds the EK private key the challenge was encrypted to and a
// loaded object whose name is the AK name the verifier put in it, which is
// what proves the AK and the EK share this TPM.
func (a *attestation) Respond(ctx context.Context, payload []byte) ([]byte, error) {
	ch, err := decodeChallenge(payload)
	if err != nil {
		return nil, fmt.Errorf("tpm respond: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, errors.New("tpm respond: attestation closed")
	}
	stop := a.conn.interruptible(ctx)
	secret, err := activate(a.conn, a.ek, a.ak, ch)
	stop()
	if err != nil {
		return nil, fmt.Errorf("tpm respond: %w", err)
	}
	defer clear(secret)
	out, err := proto.Marshal(&latchkeyv1.TPMChallengeResponse{Secret: secret})
	if err != nil {
		return nil, fmt.Errorf("tpm respond: %w", err)
	}
	return out, nil
}

// decodeChallenge size-checks and parses a challenge from the network.
func decodeChallenge(payload []byte) (*latchkeyv1.TPMChallenge, error) {
	if len(payload) > wire.MaxChallengeSize {
		return nil, fmt.Errorf("challenge has %d bytes, limit %d", len(payload), wire.MaxChallengeSize)
	}
	ch := &latchkeyv1.TPMChallenge{}
	if err := proto.Unmarshal(payload, ch); err != nil {
		return nil, fmt.Errorf("parse challenge: %w", err)
	}
	if n, m := len(ch.CredentialBlob), len(ch.EncryptedSecret); n == 0 || m == 0 || n > wire.MaxStructSize || m > wire.MaxStructSize {
		return nil, errors.New("challenge fields empty or too large")
	}
	return ch, nil
}

// activate runs TPM2_ActivateCredential. The EK's TCG template demands
// PolicySecret(TPM_RH_ENDORSEMENT). The policy session is opened and
// flushed here, whatever fails: go-tpm's one-shot sessions are not flushed
// when the policy command itself fails, and swtpm holds only three.
func activate(tp transport.TPM, ek, ak *key, ch *latchkeyv1.TPMChallenge) (secret []byte, err error) {
	sess, closeSession, err := tpm2.PolicySession(tp, tpm2.TPMAlgSHA256, 16)
	if err != nil {
		return nil, fmt.Errorf("start ek policy session: %w", err)
	}
	defer func() {
		if cerr := closeSession(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("flush ek policy session: %w", cerr))
		}
	}()
	if _, err := (tpm2.PolicySecret{
		AuthHandle:    tpm2.AuthHandle{Handle: tpm2.TPMRHEndorsement, Auth: tpm2.PasswordAuth(nil)},
		PolicySession: sess.Handle(),
		NonceTPM:      sess.NonceTPM(),
	}).Execute(tp); err != nil {
		return nil, fmt.Errorf("ek policy secret: %w", err)
	}
	rsp, err := tpm2.ActivateCredential{
		ActivateHandle: tpm2.AuthHandle{Handle: ak.handle, Name: ak.name, Auth: tpm2.PasswordAuth(nil)},
		KeyHandle:      tpm2.AuthHandle{Handle: ek.handle, Name: ek.name, Auth: sess},
		CredentialBlob: tpm2.TPM2BIDObject{Buffer: ch.CredentialBlob},
		Secret:         tpm2.TPM2BEncryptedSecret{Buffer: ch.EncryptedSecret},
	}.Execute(tp)
	if err != nil {
		return nil, fmt.Errorf("activate credential: %w", err)
	}
	return rsp.CertInfo.Buffer, nil
}
