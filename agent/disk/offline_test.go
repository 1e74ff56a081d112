package disk

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/latchkey/latchkey/attest/tpm"
	"github.com/latchkey/latchkey/attest/tpm/offline"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
)

// testSealer seals on a swtpm for grants of a test Authorizer, so the
// tokens the tests write hold real offline.Sealed encodings.
type testSealer struct {
	sim  *tpmtest.Simulator
	auth *offline.Authorizer
}

func newTestSealer(t *testing.T) *testSealer {
	t.Helper()
	tpmtest.CheckTools(t)
	key, err := offline.DeriveGrantKey(bytes.Repeat([]byte{1}, 32))
	if err != nil {
		t.Fatal(err)
	}
	a, err := offline.NewAuthorizer(key)
	if err != nil {
		t.Fatal(err)
	}
	return &testSealer{sim: tpmtest.Start(t), auth: a}
}

// token seals a key for a grant of maxBoots boots.
func (s *testSealer) token(t *testing.T, maxBoots uint32) *OfflineToken {
	t.Helper()
	pcrs := map[uint32][]byte{}
	for i := uint32(0); i < 24; i++ {
		pcrs[i] = bytes.Repeat([]byte{byte(i)}, 32)
	}
	g, err := s.auth.Grant(offline.GrantRequest{PolicyRef: offline.PolicyRef([]byte("ek"), "disk"), PCRs: pcrs,
		ResetCount: 7, ClockMS: 123456, MaxBoots: maxBoots, MaxHours: 72})
	if err != nil {
		t.Fatal(err)
	}
	tp, err := tpm.OpenDevice(s.sim.Device)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	sealed, err := offline.Seal(tp, bytes.Repeat([]byte{0x5a}, 32), g)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := sealed.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	gb, err := EncodeGrant(g)
	if err != nil {
		t.Fatal(err)
	}
	return &OfflineToken{Sealed: sb, Grant: gb}
}

// rigWithToken is a formatted disk whose header carries tok.
func rigWithToken(t *testing.T, tok *OfflineToken) (*testRig, *LUKS, Plan) {
	r := newRig(t, testDiskSize)
	l := r.stage(nil)
	plan, _ := r.mustBoot(l, testKey(1))
	r.kernel.powerOff()
	if err := l.StoreOffline(context.Background(), plan.UUID, tok); err != nil {
		t.Fatalf("store offline token: %v", err)
	}
	return r, l, plan
}

// A token written by the agent is read back by Prepare and by cryptsetup,
// the disk still opens, a replacement replaces it, and its removal gives
// back the header byte for byte.
func TestOfflineTokenRoundTrip(t *testing.T) {
	r := newRig(t, testDiskSize)
	l := r.stage(nil)
	plan, _ := r.mustBoot(l, testKey(1))
	r.kernel.powerOff()
	if plan.Offline != nil {
		t.Fatalf("a fresh disk has an offline token: %+v", plan.Offline)
	}
	orig := readDev(t, r.dev, 0, 2*hdrSize)
	h0, _ := diskHeader(t, r.dev)
	ctx := context.Background()
	ts := newTestSealer(t)
	for _, tok := range []*OfflineToken{ts.token(t, 5), ts.token(t, 6)} {
		if err := l.StoreOffline(ctx, plan.UUID, tok); err != nil {
			t.Fatalf("store: %v", err)
		}
		p2, _, err := r.boot(r.stage(nil), testKey(1))
		if err != nil {
			t.Fatalf("reboot with a token: %v", err)
		}
		r.kernel.powerOff()
		if !reflect.DeepEqual(p2.Offline, tok) {
			t.Fatalf("Prepare read back another token")
		}
		exported := run(t, nil, "cryptsetup", "token", "export", "--token-id", "0", r.dev)
		var got struct {
			Type     string   `json:"type"`
			Keyslots []string `json:"keyslots"`
			Sealed   string   `json:"sealed"`
		}
		if err := json.Unmarshal([]byte(exported), &got); err != nil || got.Type != OfflineTokenType ||
			len(got.Keyslots) != 0 || got.Sealed != base64.StdEncoding.EncodeToString(tok.Sealed) {
			t.Fatalf("cryptsetup token export: %v %q", err, exported)
		}
		if !cryptsetupOpens(t, r.dev, testKey(1)) {
			t.Fatal("cryptsetup no longer opens the disk with its key")
		}
	}
	h, _ := diskHeader(t, r.dev)
	if h.seqID != h0.seqID+2 {
		t.Fatalf("seqid %d after two token writes from %d", h.seqID, h0.seqID)
	}
	if err := l.RemoveOffline(ctx, plan.UUID); err != nil {
		t.Fatal(err)
	}
	after := readDev(t, r.dev, 0, 2*hdrSize)
	for _, off := range []int{0, secondaryOffset} {
		if !bytes.Equal(after[off+binHeaderSize:off+hdrSize], orig[off+binHeaderSize:off+hdrSize]) {
			t.Fatalf("the JSON at %d is not the original after removal", off)
		}
	}
	// Removing what is not there writes nothing.
	if err := l.RemoveOffline(ctx, plan.UUID); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readDev(t, r.dev, 0, 2*hdrSize), after) {
		t.Fatal("a second removal wrote the header")
	}
}

// A token cryptsetup itself imports is the same token to the validator.
func TestOfflineTokenImportedByCryptsetup(t *testing.T) {
	r := newRig(t, testDiskSize)
	plan, _ := r.mustBoot(r.stage(nil), testKey(1))
	r.kernel.powerOff()
	tok := newTestSealer(t).token(t, 9)
	js, _ := tokensJSON(tok)
	var one map[string]json.RawMessage
	_ = json.Unmarshal(js, &one)
	file := filepath.Join(t.TempDir(), "token.json")
	if err := os.WriteFile(file, one["0"], 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, nil, "cryptsetup", "token", "import", "--token-id", "0", "--json-file", file, r.dev)
	p2, _, err := r.boot(r.stage(nil), testKey(1))
	if err != nil {
		t.Fatalf("boot after cryptsetup token import: %v", err)
	}
	r.kernel.powerOff()
	if !reflect.DeepEqual(p2.Offline, tok) || p2.UUID != plan.UUID {
		t.Fatal("the imported token does not read back")
	}
}

// editHeader rewrites both copies' JSON with edit, checksums recomputed,
// as a host that controls the disk can.
func editHeader(t *testing.T, dev string, edit func(string) string) {
	t.Helper()
	head := readDev(t, dev, 0, 2*hdrSize)
	for _, off := range []int{0, secondaryOffset} {
		c := head[off : off+hdrSize]
		js, _ := jsonArea(c[binHeaderSize:])
		h := parseBinHeader(c)
		gen, _ := parseSubsystem(c[offSubsystem : offSubsystem+48])
		ed := edit(string(js))
		if ed == string(js) {
			t.Fatal("the edit changed nothing")
		}
		writeDev(t, dev, int64(off), buildCopy(c, h.seqID, gen, []byte(ed)))
	}
}

func grantJSONValue(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// Each edit of the token is refused with the exact reason; the
// token-shaped edits an attacker would try to slip past are refused too,
// and the bounds themselves are accepted.
func TestOfflineTokenTamperedRefused(t *testing.T) {
	tok := newTestSealer(t).token(t, 5)
	edited := bytes.Clone(tok.Sealed)
	edited[12]++ // the counter value at sealing: the policy no longer matches
	sealed := base64.StdEncoding.EncodeToString(tok.Sealed)
	grant := grantJSONValue(tok.Grant)
	unknownField := protowire.AppendVarint(protowire.AppendTag(bytes.Clone(tok.Grant), 99, protowire.VarintType), 1)
	// max_boots (field 6) first: the same grant, not in canonical order.
	reordered := protowire.AppendVarint(protowire.AppendTag(nil, 6, protowire.VarintType), 5)
	g, _ := DecodeGrant(tok.Grant)
	g.MaxBoots = 0
	rest, _ := EncodeGrant(g)
	reordered = append(reordered, rest...)
	replace := func(from, to string) func(string) string {
		return func(s string) string { return strings.Replace(s, from, to, 1) }
	}
	b64 := func(n int) string { return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, n)) }
	cases := []struct {
		name string
		edit func(string) string
		want string // "" = accepted
	}{
		{"extra key", replace(`"sealed":`, `"x":"1","sealed":`), `tokens.0 has unexpected "x"`},
		{"missing grant", replace(`"grant":"`+grant+`",`, ``), `tokens.0 lacks "grant"`},
		{"second token", replace(`"tokens":{`, `"tokens":{"1":{"type":"luks2-keyring","keyslots":[],"key_description":"k"},`), `tokens has unexpected "1"`},
		{"duplicate token", replace(`"tokens":{`, `"tokens":{"0":{},`), `JSON metadata: duplicate key "0"`},
		{"token under id 1", replace(`"tokens":{"0":`, `"tokens":{"1":`), `tokens has unexpected "1"`},
		{"systemd-tpm2 type", replace(`"latchkey-offline"`, `"systemd-tpm2"`), `tokens.0 is a token of type "systemd-tpm2", want "latchkey-offline"`},
		{"type case variant", replace(`"type":"latchkey-offline"`, `"Type":"latchkey-offline"`), `tokens.0 is a token of type null, want "latchkey-offline"`},
		{"token bound to keyslot 0", replace(`"keyslots":[]`, `"keyslots":["0"]`), `tokens.0.keyslots is a list of 1, want a list of 0`},
		{"sealed not base64", replace(sealed, "!!"+sealed[2:]), `tokens.0.sealed is not base64`},
		{"sealed url-safe base64", replace(sealed, "-_"+sealed[2:]), `tokens.0.sealed is not base64`},
		{"sealed empty", replace(`"sealed":"`+sealed+`"`, `"sealed":""`), `tokens.0.sealed is 0 bytes, want 1 to 2048`},
		{"sealed a number", replace(`"sealed":"`+sealed+`"`, `"sealed":1`), `tokens.0.sealed is number 1, want a base64 string`},
		{"sealed oversized", replace(sealed, b64(3000)), `tokens.0.sealed is over 2048 bytes`},
		{"sealed one byte over", replace(sealed, b64(2049)), `tokens.0.sealed is 2049 bytes, want 1 to 2048`},
		{"sealed at the bound", replace(sealed, b64(2048)), `tokens.0.sealed is not a sealed key latchkey wrote`},
		{"sealed counter edited", replace(sealed, base64.StdEncoding.EncodeToString(edited)), `tokens.0.sealed is not a sealed key latchkey wrote`},
		{"grant garbage", replace(grant, b64(40)), `tokens.0.grant is not an OfflineGrant`},
		{"grant unknown field", replace(grant, grantJSONValue(unknownField)), `tokens.0.grant holds fields an OfflineGrant does not have`},
		{"grant reordered", replace(grant, grantJSONValue(reordered)), `tokens.0.grant is not the canonical encoding of its OfflineGrant`},
		{"grant oversized", replace(grant, b64(2100)), `tokens.0.grant is over 2048 bytes`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, _, _ := rigWithToken(t, tok)
			editHeader(t, r.dev, tc.edit)
			_, err := validateHeader(readDev(t, r.dev, 0, blankCheckLength), "")
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrHeaderRejected) || err.Error() != ErrHeaderRejected.Error()+": "+tc.want {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
			// Prepare refuses it as latchkey's altered header.
			if _, err := r.stage(nil).Prepare(context.Background()); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Prepare: %v", err)
			}
		})
	}
}

// Everything the validator refused before is still refused with a token
// beside it, and a tokens value of another kind is refused.
func TestOfflineTokenDoesNotWidenTheShape(t *testing.T) {
	r, _, _ := rigWithToken(t, newTestSealer(t).token(t, 5))
	editHeader(t, r.dev, func(s string) string { return strings.Replace(s, `"sector_size":4096`, `"sector_size":512`, 1) })
	_, err := validateHeader(readDev(t, r.dev, 0, blankCheckLength), "")
	if want := ErrHeaderRejected.Error() + ": segments.0.sector_size is number 512, want number 4096"; err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
	r2 := newRig(t, testDiskSize)
	r2.mustBoot(r2.stage(nil), testKey(1))
	r2.kernel.powerOff()
	editHeader(t, r2.dev, func(s string) string { return strings.Replace(s, `"tokens":{}`, `"tokens":[]`, 1) })
	_, err = validateHeader(readDev(t, r2.dev, 0, blankCheckLength), "")
	if want := ErrHeaderRejected.Error() + ": tokens is a list of 0, want an object"; err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
}

// A token write cut short between its two copies leaves a header that
// validates with the primary's (new) token; the next write settles both
// copies. Copies that differ in anything else besides the token are
// still refused.
func TestOfflineTokenWriteCutShort(t *testing.T) {
	ts := newTestSealer(t)
	old, next := ts.token(t, 5), ts.token(t, 6)
	r, _, plan := rigWithToken(t, old)
	stop := errors.New("killed")
	cut := r.stage(func(c *LUKSConfig) {
		c.FaultHook = func(s Step) error {
			if s == StepOfflinePrimaryWritten {
				return stop
			}
			return nil
		}
	})
	if err := cut.StoreOffline(context.Background(), plan.UUID, next); !errors.Is(err, stop) {
		t.Fatalf("cut-short write: %v", err)
	}
	head := readDev(t, r.dev, 0, blankCheckLength)
	if bytes.Equal(head[binHeaderSize:hdrSize], head[secondaryOffset+binHeaderSize:secondaryOffset+hdrSize]) {
		t.Fatal("both copies were written")
	}
	p2, _, err := r.boot(r.stage(nil), testKey(1))
	if err != nil {
		t.Fatalf("boot after a cut-short token write: %v", err)
	}
	r.kernel.powerOff()
	if !reflect.DeepEqual(p2.Offline, next) {
		t.Fatal("the cut-short state does not read as the primary's token")
	}
	if err := r.stage(nil).RemoveOffline(context.Background(), plan.UUID); err != nil {
		t.Fatal(err)
	}
	h, head := diskHeader(t, r.dev)
	if offlineTokenOf(h.json) != nil || !bytes.Equal(head[binHeaderSize:hdrSize], head[secondaryOffset+binHeaderSize:secondaryOffset+hdrSize]) {
		t.Fatal("the removal did not settle both copies")
	}
	// Slip past: the copies differ in the token and in the segment.
	if err := cut.StoreOffline(context.Background(), plan.UUID, next); !errors.Is(err, stop) {
		t.Fatal(err)
	}
	primary := readDev(t, r.dev, 0, hdrSize)
	js, _ := jsonArea(primary[binHeaderSize:])
	bh := parseBinHeader(primary)
	writeDev(t, r.dev, 0, buildCopy(primary, bh.seqID, 0, []byte(strings.Replace(string(js), `"sector_size":4096`, `"sector_size":512`, 1))))
	if _, err := validateHeader(readDev(t, r.dev, 0, blankCheckLength), ""); err == nil ||
		err.Error() != ErrHeaderRejected.Error()+": segments.0.sector_size is number 512, want number 4096" {
		t.Fatalf("a segment edit beside a token transition: %v", err)
	}
	// Slip past: only the token differs but the primary is not one seqid ahead.
	writeDev(t, r.dev, 0, buildCopy(primary, bh.seqID+1, 0, js))
	if _, err := validateHeader(readDev(t, r.dev, 0, blankCheckLength), ""); err == nil ||
		!strings.HasPrefix(err.Error(), ErrHeaderRejected.Error()+": primary and secondary headers differ") {
		t.Fatalf("a token transition two seqids apart: %v", err)
	}
}
