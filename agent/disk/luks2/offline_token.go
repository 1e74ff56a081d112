package luks2

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"

	"google.golang.org/protobuf/proto"

	"github.com/latchkey/latchkey/attest/tpm/offline"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// The offline token's format: its shape in the header validator, its
// encoding, the cut-short write state, and the header copies that carry
// it (pure functions over header bytes; agent/disk's offline.go writes
// them and holds the design).

// OfflineTokenType is the LUKS2 token type of the offline token.
const OfflineTokenType = "latchkey-offline"

// Size bounds of the token's values (decoded bytes). A sealed keyedhash
// object with its policy is a few hundred bytes; a grant with 24 PCRs
// about 1.2 KiB. Both together stay far inside the 12 KiB JSON area.
const (
	MaxOfflineSealed = 2048
	MaxOfflineGrant  = 2048
)

// OfflineToken is what the offline token holds.
type OfflineToken struct {
	// Sealed is the offline.Sealed encoding.
	Sealed []byte
	// Grant is the current OfflineGrant, deterministically encoded.
	Grant []byte
}

// offlineTokenShape is the expected shape of the tokens object of the
// JSON tree: empty when the tree has no tokens (or something that is not
// an object, which the comparison then names), otherwise token 0.
func offlineTokenShape(tree any) obj {
	root, _ := tree.(map[string]any)
	tokens, _ := root["tokens"].(map[string]any)
	if len(tokens) == 0 {
		return obj{}
	}
	if tok, ok := tokens["0"].(map[string]any); ok && tok["type"] != OfflineTokenType {
		// Another kind of token (a recovery token, systemd's): named by
		// its type rather than by the keys it lacks.
		return obj{"0": matcher(func(any) error {
			return fmt.Errorf("is a token of type %s, want %q", describe(tok["type"]), OfflineTokenType)
		})}
	}
	return obj{"0": obj{
		"type":     OfflineTokenType,
		"keyslots": arr{},
		"sealed":   base64Within(MaxOfflineSealed, checkSealedEncoding),
		"grant":    base64Within(MaxOfflineGrant, checkGrantEncoding),
	}}
}

// base64Within matches a standard-base64 string of 1 to n bytes that
// then pass check (when set).
func base64Within(n int, check func([]byte) error) matcher {
	return func(v any) error {
		s, ok := v.(string)
		if !ok {
			return fmt.Errorf("is %s, want a base64 string", describe(v))
		}
		if base64.StdEncoding.DecodedLen(len(s)) > n+2 {
			return fmt.Errorf("is over %d bytes", n)
		}
		b, err := base64.StdEncoding.Strict().DecodeString(s)
		switch {
		case err != nil:
			return errors.New("is not base64")
		case len(b) == 0 || len(b) > n:
			return fmt.Errorf("is %d bytes, want 1 to %d", len(b), n)
		case check != nil:
			return check(b)
		}
		return nil
	}
}

// checkGrantEncoding accepts exactly what encodeGrant writes: an
// OfflineGrant with no unknown field, deterministically encoded.
func checkGrantEncoding(b []byte) error {
	g := &latchkeyv1.OfflineGrant{}
	if err := (proto.UnmarshalOptions{RecursionLimit: 4}).Unmarshal(b, g); err != nil {
		return errors.New("is not an OfflineGrant")
	}
	if len(g.ProtoReflect().GetUnknown()) != 0 {
		return errors.New("holds fields an OfflineGrant does not have")
	}
	again, err := EncodeGrant(g)
	if err != nil || !bytes.Equal(again, b) {
		return errors.New("is not the canonical encoding of its OfflineGrant")
	}
	return nil
}

// checkSealedEncoding accepts a valid offline.Sealed encoding (its
// UnmarshalBinary checks every field and the object's policy).
func checkSealedEncoding(b []byte) error {
	var s offline.Sealed
	if err := s.UnmarshalBinary(b); err != nil {
		return errors.New("is not a sealed key latchkey wrote")
	}
	return nil
}

// EncodeGrant is the grant's encoding in the token (deterministic, so the
// validator can demand exactly it).
func EncodeGrant(g *latchkeyv1.OfflineGrant) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(g)
}

// DecodeGrant decodes a token's grant (already validated).
func DecodeGrant(b []byte) (*latchkeyv1.OfflineGrant, error) {
	g := &latchkeyv1.OfflineGrant{}
	if err := checkGrantEncoding(b); err != nil {
		return nil, fmt.Errorf("offline token grant %w", err)
	}
	return g, proto.Unmarshal(b, g)
}

// OfflineTokenOf returns the token of JSON the validator accepted, nil
// when it has none.
func OfflineTokenOf(js []byte) *OfflineToken {
	tree, err := parseStrictJSON(js)
	if err != nil {
		return nil
	}
	root, _ := tree.(map[string]any)
	tokens, _ := root["tokens"].(map[string]any)
	tok, _ := tokens["0"].(map[string]any)
	if tok == nil {
		return nil
	}
	sealed, err1 := base64.StdEncoding.Strict().DecodeString(tok["sealed"].(string))
	grant, err2 := base64.StdEncoding.Strict().DecodeString(tok["grant"].(string))
	if err1 != nil || err2 != nil {
		return nil
	}
	return &OfflineToken{Sealed: sealed, Grant: grant}
}

// tokenTransition accepts the state an offline token write cut short
// between its two copies leaves: the primary one seqid ahead, the same
// generation, and JSON trees equal except for their tokens (both already
// of the exact shape).
func tokenTransition(p, s BinHeader, pj, sj []byte) bool {
	if p.SeqID != s.SeqID+1 || p.Generation != s.Generation || checkShape(sj) != nil {
		return false
	}
	pt, err1 := parseStrictJSON(pj)
	st, err2 := parseStrictJSON(sj)
	if err1 != nil || err2 != nil {
		return false
	}
	delete(pt.(map[string]any), "tokens")
	delete(st.(map[string]any), "tokens")
	return reflect.DeepEqual(pt, st)
}

// withTokens returns js with its tokens value replaced by tokens (JSON
// text), as text, so everything else stays byte for byte what it was
// (the rewrap edits the same text by pattern).
func withTokens(js []byte, tokens []byte) ([]byte, error) {
	key := []byte(`"tokens":`)
	if n := bytes.Count(js, key); n != 1 {
		return nil, fmt.Errorf("header JSON holds %q %d times, want once", key, n)
	}
	start := bytes.Index(js, key) + len(key)
	dec := json.NewDecoder(bytes.NewReader(js[start:]))
	var old json.RawMessage
	if err := dec.Decode(&old); err != nil {
		return nil, fmt.Errorf("header JSON tokens: %w", err)
	}
	end := start + int(dec.InputOffset())
	out := append(append(append([]byte{}, js[:start]...), tokens...), js[end:]...)
	if len(out) >= JSONAreaSize {
		return nil, fmt.Errorf("header JSON with the offline token is %d bytes, over the %d-byte area", len(out), JSONAreaSize)
	}
	return out, nil
}

// tokensJSON is the tokens object holding tok (nil: none).
func tokensJSON(tok *OfflineToken) ([]byte, error) {
	if tok == nil {
		return []byte("{}"), nil
	}
	return json.Marshal(map[string]any{"0": map[string]any{
		"type": OfflineTokenType, "keyslots": []string{},
		"sealed": base64.StdEncoding.EncodeToString(tok.Sealed),
		"grant":  base64.StdEncoding.EncodeToString(tok.Grant),
	}})
}

// BuildOffline builds both header copies carrying tok (nil: no token)
// from the validated header h and proves the result; nil copies when the
// disk already holds exactly that, in both copies.
func BuildOffline(head []byte, h *Header, tok *OfflineToken) (primary, second []byte, err error) {
	if h.Prior != nil {
		return nil, nil, errors.New("offline token: the header is in a rewrap's transitional state")
	}
	tokens, err := tokensJSON(tok)
	if err != nil {
		return nil, nil, err
	}
	js, err := withTokens(h.JSON, tokens)
	if err != nil {
		return nil, nil, err
	}
	sj, _ := JSONArea(head[SecondaryOffset+BinHeaderSize : SecondaryOffset+HeaderSize])
	if bytes.Equal(js, h.JSON) && bytes.Equal(js, sj) {
		return nil, nil, nil
	}
	seq := h.SeqID + 1
	primary = EncodeCopy(head[:HeaderSize], seq, h.Generation, js)
	second = EncodeCopy(head[SecondaryOffset:SecondaryOffset+HeaderSize], seq, h.Generation, js)
	img := bytes.Clone(head)
	copy(img, primary)
	copy(img[SecondaryOffset:], second)
	got, err := Validate(img, h.UUID)
	if err != nil {
		return nil, nil, fmt.Errorf("the header with the offline token does not validate: %w", err)
	}
	if !reflect.DeepEqual(OfflineTokenOf(got.JSON), tok) || got.Area != h.Area || got.Generation != h.Generation {
		return nil, nil, errors.New("the header with the offline token does not read back as written")
	}
	return primary, second, nil
}
