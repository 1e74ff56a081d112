package tpm

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"

	"github.com/google/go-tpm/tpm2"
	"google.golang.org/protobuf/proto"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tpm/wire"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// activateAK proves that the AK named akName lives in the TPM holding ek:
// it encrypts a fresh random secret to ek so that only TPM2_ActivateCredential
// on that TPM, with an object of that name loaded, recovers it, sends the
// challenge through rt and compares the answer in constant time.
//
// A round trip that fails because ctx ended is UNAVAILABLE; a refusal the
// round trip itself produced (the service's framing checks) is passed on;
// any other round-trip failure, and a wrong answer, is ACTIVATION_FAILED;
// an answer that does not parse is MALFORMED.
func activateAK(ctx context.Context, rt attest.RoundTrip, rand io.Reader, ek *tpm2.TPMTPublic, akName []byte) error {
	if rt == nil {
		return attest.Refuse(latchkeyv1.Reason_INTERNAL, "credential activation needs a round trip, none given")
	}
	secret, payload, err := makeChallenge(rand, ek, akName)
	if err != nil {
		return attest.Refuse(latchkeyv1.Reason_INTERNAL, "make credential: %w", err)
	}
	defer clear(secret)
	answer, err := rt(ctx, payload)
	if err != nil {
		return roundTripRefusal(ctx, err)
	}
	got, err := decodeResponse(answer)
	if err != nil {
		return attest.Refuse(latchkeyv1.Reason_MALFORMED, "challenge response: %w", err)
	}
	defer clear(got)
	if subtle.ConstantTimeCompare(got, secret) != 1 {
		return attest.Refuse(latchkeyv1.Reason_ACTIVATION_FAILED, "credential activation answer is wrong")
	}
	return nil
}

// makeChallenge returns a random secret and the serialized TPMChallenge
// (TPM2_MakeCredential, computed in software) that wraps it for ek and
// akName.
func makeChallenge(rand io.Reader, ek *tpm2.TPMTPublic, akName []byte) (secret, payload []byte, err error) {
	encKey, err := tpm2.ImportEncapsulationKey(ek)
	if err != nil {
		return nil, nil, err
	}
	secret = make([]byte, secretSize)
	if _, err := io.ReadFull(rand, secret); err != nil {
		return nil, nil, err
	}
	blob, encSecret, err := tpm2.CreateCredential(rand, encKey, akName, secret)
	if err != nil {
		clear(secret)
		return nil, nil, err
	}
	payload, err = proto.Marshal(&latchkeyv1.TPMChallenge{CredentialBlob: blob, EncryptedSecret: encSecret})
	if err != nil {
		clear(secret)
		return nil, nil, err
	}
	return secret, payload, nil
}

func decodeResponse(answer []byte) ([]byte, error) {
	if len(answer) > wire.MaxChallengeResponseSize {
		return nil, fmt.Errorf("%d bytes, limit %d", len(answer), wire.MaxChallengeResponseSize)
	}
	var rsp latchkeyv1.TPMChallengeResponse
	if err := proto.Unmarshal(answer, &rsp); err != nil {
		return nil, err
	}
	return rsp.Secret, nil
}

func roundTripRefusal(ctx context.Context, err error) error {
	var r *attest.Refusal
	switch {
	case errors.As(err, &r):
		return err
	case ctx.Err() != nil:
		return attest.Refuse(latchkeyv1.Reason_UNAVAILABLE, "challenge round trip: %w", err)
	default:
		return attest.Refuse(latchkeyv1.Reason_ACTIVATION_FAILED, "challenge round trip: %w", err)
	}
}
