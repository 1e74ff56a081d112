package tdx

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tdx-guest/pcs"
	tdxtesting "github.com/google/go-tdx-guest/testing"
	"github.com/google/go-tdx-guest/testing/testdata"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tdx/wire"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// The quote go-tdx-guest ships was taken on a Sapphire Rapids (E4) TDX
// host; its collateral (TCB info for FMSPC 50806f000000, TD QE identity,
// CRLs) is valid at verifyTime.
var verifyTime = time.Date(2023, time.July, 1, 1, 0, 0, 0, time.UTC)

const (
	realFMSPC = "50806f000000"
	realMRTD  = "6363b8043668a3ad953278e10389574d326c6749fb78aa810ecd9336923db86f22fc00b8dcd404bc10d5e119d7215cbb"
)

var realRTMRs = [numRTMRs]string{
	"2927da70461cd63266f43230cc1849c03ef25ebe490062a801d8fcc80af42976823adf08f833c1e50b51779c6593f32a",
	"2c700b8ba9b85783f8be9fb9443647bdc0bb3c50747f06297cc6538c25a5f589c4b56d035c59107c6bc5800db2cacb61",
	"8652f0caaba7e215ea442dc36a4499d8fec3362f3a0b2ca151cbe4b3e6466fe59c7368b3c2287fc7c3bf5c924eb4424e",
	strings.Repeat("0", 96),
}

// Offsets of TD quote body fields in a version 4 quote (48-byte header).
const (
	offTeeTcbSvn   = 48
	offAttributes  = 168
	offXFAM        = 176
	offMRTD        = 184
	offMRConfigID  = 232
	offMROwner     = 280
	offMROwnerConf = 328
	offRTMRs       = 376
	offReportData  = 568
)

// realPolicy lists the real quote's own values.
func realPolicy() Policy {
	p := Policy{MRTDs: []string{realMRTD}}
	for _, r := range realRTMRs[:3] {
		p.RTMRs = append(p.RTMRs, []string{r})
	}
	return p
}

// collateralDir fills a cache through FetchCollateral from go-tdx-guest's
// recorded PCS responses, as `collateral fetch` would from Intel.
func collateralDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := FetchCollateral(context.Background(), tdxtesting.TestGetter, Policy{}, realFMSPC, "platform", dir, verifyTime); err != nil {
		t.Fatalf("FetchCollateral: %v", err)
	}
	return dir
}

func newRealValidator(t *testing.T, p Policy, dir string, at time.Time, opts ...ValidatorOption) *Validator {
	t.Helper()
	var coll *Collateral
	if dir != "" {
		var err error
		if coll, err = NewCollateral(CollateralConfig{Dir: dir}); err != nil {
			t.Fatal(err)
		}
	}
	opts = append([]ValidatorOption{WithClock(func() time.Time { return at }), WithReportData(realReportData())}, opts...)
	v, err := NewValidator(p, coll, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// realQuote is the quote go-tdx-guest ships without the bytes its
// maintainers appended after the signed data ("extra bytes(only for
// testing purpose)"), which the validator refuses.
var realQuote = testdata.RawQuote[:wire.QuoteLength(testdata.RawQuote)]

// realReportData is the real quote's own REPORTDATA.
func realReportData() [wire.ReportDataSize]byte {
	var rd [wire.ReportDataSize]byte
	copy(rd[:], realQuote[offReportData:offReportData+wire.ReportDataSize])
	return rd
}

func tdxGetter() *tdxtesting.Getter { return tdxtesting.TestGetter }

func encodeEvidence(q []byte) ([]byte, error) { return wire.EncodeEvidence(wire.Evidence{Quote: q}) }

func evidenceOf(t *testing.T, quote []byte) []byte {
	t.Helper()
	ev, err := wire.EncodeEvidence(wire.Evidence{Quote: quote})
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

var someBinding = make([]byte, attest.BindingSize)

func wantRefusal(t *testing.T, err error, reason latchkeyv1.Reason, detail string) {
	t.Helper()
	var r *attest.Refusal
	if !errors.As(err, &r) {
		t.Fatalf("got %v, want a %s refusal containing %q", err, reason, detail)
	}
	if r.Reason != reason || !strings.Contains(r.Detail, detail) {
		t.Fatalf("got %s %q, want %s containing %q", r.Reason, r.Detail, reason, detail)
	}
}

// TestVerifyRealQuote verifies a quote taken on real TDX hardware, with
// Intel's own collateral, offline at a fixed time: every check of Verify
// passes and the decoded state is the quote's.
func TestVerifyRealQuote(t *testing.T) {
	v := newRealValidator(t, realPolicy(), collateralDir(t), verifyTime)
	ver, err := v.Verify(context.Background(), evidenceOf(t, realQuote), someBinding, nil)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	st := ver.State.(*State)
	if got := hex.EncodeToString(st.MRTD); got != realMRTD {
		t.Errorf("MRTD = %s, want %s", got, realMRTD)
	}
	for i, want := range realRTMRs {
		if got := hex.EncodeToString(st.RTMRs[i]); got != want {
			t.Errorf("RTMR[%d] = %s, want %s", i, got, want)
		}
	}
	if st.FMSPC != realFMSPC || hex.EncodeToString(st.TeeTcbSvn) != "03000400000000000000000000000000" || st.Debug() {
		t.Errorf("FMSPC %s TEE_TCB_SVN %x debug %v", st.FMSPC, st.TeeTcbSvn, st.Debug())
	}
	if len(st.PPID) != 16 || ver.MachineID != "tdx-ppid:"+hex.EncodeToString(st.PPID) {
		t.Errorf("PPID %x, MachineID %q", st.PPID, ver.MachineID)
	}
	if k := st.Keys(); len(k) != 1 || k[0].Kind != attest.KeyTDXPPID {
		t.Errorf("Keys = %v", k)
	}
	// The QE is current; the platform's CPUSVN (PCK 03030202020100 02) is
	// below every level of this TCB info, which go-tdx-guest's own test
	// notes too ("no matching TCB level found").
	if st.QETCBStatus != "UpToDate" || st.PlatformTCBStatus != NoTCBLevel {
		t.Errorf("QE status %q, platform status %q", st.QETCBStatus, st.PlatformTCBStatus)
	}
	wantRefusal(t, v.CheckPolicy(st), latchkeyv1.Reason_TCB_TOO_OLD, "no platform TCB level of Intel's collateral matches (FMSPC 50806f000000")
}

// realState is the verified state of the real quote.
func realState(t *testing.T, dir string) *State {
	t.Helper()
	v := newRealValidator(t, realPolicy(), dir, verifyTime)
	ver, err := v.Verify(context.Background(), evidenceOf(t, realQuote), someBinding, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ver.State.(*State)
}

// TestCheckPolicy refuses each policy check with its exact reason, on the
// verified state of the real quote; the accepting case raises the state's
// platform status to a listed one (the only value of the state the
// shipped collateral cannot give).
func TestCheckPolicy(t *testing.T) {
	st := realState(t, collateralDir(t))
	other := strings.Repeat("ab", measurementSize)
	tests := []struct {
		name   string
		edit   func(p *Policy)
		status string
		reason latchkeyv1.Reason
		detail string
	}{
		{"accepted", nil, "UpToDate", latchkeyv1.Reason_REASON_UNSPECIFIED, ""},
		{"no MRTD listed", func(p *Policy) { p.MRTDs = nil }, "UpToDate", latchkeyv1.Reason_MEASUREMENT_NOT_ALLOWED, "MRTD " + realMRTD + " is not in the policy"},
		{"other MRTD", func(p *Policy) { p.MRTDs = []string{other} }, "UpToDate", latchkeyv1.Reason_MEASUREMENT_NOT_ALLOWED, "MRTD " + realMRTD},
		{"RTMR0", func(p *Policy) { p.RTMRs[0] = []string{other} }, "UpToDate", latchkeyv1.Reason_PCR_MISMATCH, "RTMR[0] " + realRTMRs[0]},
		{"RTMR1", func(p *Policy) { p.RTMRs[1] = []string{other} }, "UpToDate", latchkeyv1.Reason_PCR_MISMATCH, "RTMR[1] " + realRTMRs[1]},
		{"RTMR2 unlisted must be zero", func(p *Policy) { p.RTMRs = p.RTMRs[:2] }, "UpToDate", latchkeyv1.Reason_PCR_MISMATCH, "RTMR[2] " + realRTMRs[2]},
		{"RTMR3", func(p *Policy) { p.RTMRs = append(p.RTMRs, []string{other}) }, "UpToDate", latchkeyv1.Reason_PCR_MISMATCH, "RTMR[3] " + realRTMRs[3]},
		{"RTMR several accepted", func(p *Policy) { p.RTMRs[0] = []string{other, realRTMRs[0]} }, "UpToDate", latchkeyv1.Reason_REASON_UNSPECIFIED, ""},
		{"attributes", func(p *Policy) { p.Attributes = []string{"0000000000000000"} }, "UpToDate", latchkeyv1.Reason_GUEST_POLICY_MISMATCH, "ATTRIBUTES 0000004000000000"},
		{"xfam", func(p *Policy) { p.XFAMs = []string{"e700060000000000"} }, "UpToDate", latchkeyv1.Reason_GUEST_POLICY_MISMATCH, "XFAM e71a060000000000"},
		{"mrconfigid", func(p *Policy) { p.MRConfigIDs = []string{other} }, "UpToDate", latchkeyv1.Reason_GUEST_POLICY_MISMATCH, "MRCONFIGID " + strings.Repeat("0", 96)},
		{"mrowner", func(p *Policy) { p.MROwners = []string{other} }, "UpToDate", latchkeyv1.Reason_GUEST_POLICY_MISMATCH, "MROWNER " + strings.Repeat("0", 96)},
		{"mrownerconfig", func(p *Policy) { p.MROwnerConfigs = []string{other} }, "UpToDate", latchkeyv1.Reason_GUEST_POLICY_MISMATCH, "MROWNERCONFIG " + strings.Repeat("0", 96)},
		{"config listed", func(p *Policy) {
			p.Attributes, p.XFAMs = []string{"0000004000000000"}, []string{"e71a060000000000"}
			p.MRConfigIDs = []string{strings.Repeat("0", 96)}
		}, "UpToDate", latchkeyv1.Reason_REASON_UNSPECIFIED, ""},
		{"tee tcb svn", func(p *Policy) { p.MinimumTeeTcbSvn = "03000500000000000000000000000000" }, "UpToDate", latchkeyv1.Reason_TCB_TOO_OLD, "TEE_TCB_SVN 03000400000000000000000000000000 is below the minimum 03000500000000000000000000000000 at byte 2"},
		{"tee tcb svn met", func(p *Policy) { p.MinimumTeeTcbSvn = "03000400000000000000000000000000" }, "UpToDate", latchkeyv1.Reason_REASON_UNSPECIFIED, ""},
		{"status not listed", nil, "SWHardeningNeeded", latchkeyv1.Reason_TCB_TOO_OLD, "platform TCB status SWHardeningNeeded is not accepted by the policy"},
		{"status listed", func(p *Policy) { p.TCBStatuses = []string{"UpToDate", "SWHardeningNeeded"} }, "SWHardeningNeeded", latchkeyv1.Reason_REASON_UNSPECIFIED, ""},
		{"out of date", func(p *Policy) { p.TCBStatuses = []string{"SWHardeningNeeded"} }, "OutOfDate", latchkeyv1.Reason_TCB_TOO_OLD, "platform TCB status OutOfDate"},
		{"revoked", func(p *Policy) { p.TCBStatuses = []string{"OutOfDate"} }, "Revoked", latchkeyv1.Reason_TCB_TOO_OLD, "platform TCB status Revoked"},
		{"QE status not listed", func(p *Policy) { p.TCBStatuses = []string{"SWHardeningNeeded"} }, "SWHardeningNeeded", latchkeyv1.Reason_TCB_TOO_OLD, "quoting enclave TCB status UpToDate is not accepted"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := realPolicy()
			if tc.edit != nil {
				tc.edit(&p)
			}
			v, err := NewValidator(p, nil)
			if err != nil {
				t.Fatal(err)
			}
			s := *st
			s.PlatformTCBStatus = statusOf(tc.status)
			err = v.CheckPolicy(&s)
			if tc.reason == latchkeyv1.Reason_REASON_UNSPECIFIED {
				if err != nil {
					t.Fatalf("CheckPolicy: %v", err)
				}
				return
			}
			wantRefusal(t, err, tc.reason, tc.detail)
		})
	}
}

// TestCheckPolicyDebug refuses a debug TD unless the policy allows it. No
// hardware quote here is a debug TD, so the state's DEBUG bit is set by
// hand; TestTamperedQuote shows a quote cannot be edited to clear it.
func TestCheckPolicyDebug(t *testing.T) {
	st := realState(t, collateralDir(t))
	s := *st
	s.PlatformTCBStatus = "UpToDate"
	s.Attributes = []byte{1, 0, 0, 0x40, 0, 0, 0, 0}
	v, _ := NewValidator(realPolicy(), nil)
	wantRefusal(t, v.CheckPolicy(&s), latchkeyv1.Reason_DEBUG_POLICY, "TD attributes 0100004000000000 allow debugging")
	p := realPolicy()
	p.AllowDebug = true
	v, _ = NewValidator(p, nil)
	if err := v.CheckPolicy(&s); err != nil {
		t.Fatalf("AllowDebug: %v", err)
	}
}

func TestCheckPolicyStateMismatch(t *testing.T) {
	v, _ := NewValidator(realPolicy(), nil)
	wantRefusal(t, v.CheckPolicy(nil), latchkeyv1.Reason_INTERNAL, "VARIANT_TDX policy step given no verified state")
	wantRefusal(t, v.CheckPolicy(&State{MRTD: make([]byte, 48)}), latchkeyv1.Reason_INTERNAL, "cannot judge a *tdx.State")
}

// TestTamperedQuote edits each field an attacker controls to the value a
// policy would want and keeps the signature: every edit is refused as a
// bad signature, so no policy check can be slipped past by editing.
func TestTamperedQuote(t *testing.T) {
	v := newRealValidator(t, realPolicy(), collateralDir(t), verifyTime)
	fields := []struct {
		name string
		off  int
		val  byte
	}{
		{"TEE_TCB_SVN raised", offTeeTcbSvn + 2, 9},
		{"DEBUG cleared/set", offAttributes, 1},
		{"XFAM", offXFAM, 0xe7},
		{"MRTD", offMRTD, 0x00},
		{"MRCONFIGID", offMRConfigID, 1},
		{"MROWNER", offMROwner, 1},
		{"MROWNERCONFIG", offMROwnerConf, 1},
		{"RTMR0", offRTMRs, 0},
		{"RTMR3", offRTMRs + 3*measurementSize, 1},
		{"REPORTDATA (binding)", offReportData, 0},
	}
	for _, f := range fields {
		t.Run(f.name, func(t *testing.T) {
			q := append([]byte(nil), realQuote...)
			if q[f.off] == f.val {
				q[f.off] ^= 0xff
			} else {
				q[f.off] = f.val
			}
			_, err := v.Verify(context.Background(), evidenceOf(t, q), someBinding, nil)
			wantRefusal(t, err, latchkeyv1.Reason_BAD_SIGNATURE, "quote signature")
		})
	}
}

// TestVerifyRefusals covers the checks of Verify other than the policy's.
func TestVerifyRefusals(t *testing.T) {
	dir := collateralDir(t)
	ev := evidenceOf(t, realQuote)
	ctx := context.Background()

	t.Run("binding", func(t *testing.T) {
		v, err := NewValidator(realPolicy(), mustCollateral(t, dir), WithClock(func() time.Time { return verifyTime }))
		if err != nil {
			t.Fatal(err)
		}
		_, err = v.Verify(ctx, ev, someBinding, nil)
		wantRefusal(t, err, latchkeyv1.Reason_BINDING_MISMATCH, "REPORTDATA is not this session's binding")
	})
	t.Run("binding length", func(t *testing.T) {
		v := newRealValidator(t, realPolicy(), dir, verifyTime)
		_, err := v.Verify(ctx, ev, someBinding[:31], nil)
		if err == nil || attest.ReasonOf(err) != latchkeyv1.Reason_INTERNAL {
			t.Fatalf("got %v, want a plain error", err)
		}
	})
	t.Run("truncated quote", func(t *testing.T) {
		v := newRealValidator(t, realPolicy(), dir, verifyTime)
		_, err := v.Verify(ctx, evidenceOf(t, realQuote[:1000]), someBinding, nil)
		wantRefusal(t, err, latchkeyv1.Reason_MALFORMED, "quote:")
	})
	// A quote whose signed data length field (attacker-controlled) is
	// below what the signature, key and certification header take, the
	// whole quote cut to match: go-tdx-guest's parser sliced past it and
	// panicked (found by FuzzDecode).
	shortSigned := func(n int) []byte {
		q := append([]byte(nil), realQuote[:wire.QuoteLength(realQuote)-wire.SignedDataLength(realQuote)+n]...)
		binary.LittleEndian.PutUint32(q[48+584:], uint32(n))
		return q
	}
	t.Run("signed data too short", func(t *testing.T) {
		v := newRealValidator(t, realPolicy(), dir, verifyTime)
		_, err := v.Verify(ctx, evidenceOf(t, shortSigned(67)), someBinding, nil)
		wantRefusal(t, err, latchkeyv1.Reason_MALFORMED, "quote: 67 bytes of signed data, fewer than the 134 its signature, attestation key and certification data header take")
	})
	t.Run("signed data just long enough, certification data cut", func(t *testing.T) {
		// Past the length check, the parser itself must refuse, not panic.
		v := newRealValidator(t, realPolicy(), dir, verifyTime)
		_, err := v.Verify(ctx, evidenceOf(t, shortSigned(minSignedData)), someBinding, nil)
		wantRefusal(t, err, latchkeyv1.Reason_MALFORMED, "quote:")
	})
	t.Run("oversized evidence", func(t *testing.T) {
		v := newRealValidator(t, realPolicy(), dir, verifyTime)
		_, err := v.Verify(ctx, make([]byte, wire.MaxEvidenceSize+1), someBinding, nil)
		wantRefusal(t, err, latchkeyv1.Reason_MALFORMED, "exceeds")
	})
	t.Run("trailing bytes", func(t *testing.T) {
		v := newRealValidator(t, realPolicy(), dir, verifyTime)
		_, err := v.Verify(ctx, evidenceOf(t, testdata.RawQuote), someBinding, nil)
		wantRefusal(t, err, latchkeyv1.Reason_MALFORMED, "quote: 4974 bytes, its signed data length says 4935")
	})
	t.Run("no collateral cache", func(t *testing.T) {
		v := newRealValidator(t, realPolicy(), "", verifyTime)
		_, err := v.Verify(ctx, ev, someBinding, nil)
		wantRefusal(t, err, latchkeyv1.Reason_COLLATERAL_MISSING, "no TDX collateral cache is configured (tdxCollateralDir); TCB info for FMSPC 50806f000000")
	})
	t.Run("empty cache", func(t *testing.T) {
		v := newRealValidator(t, realPolicy(), t.TempDir(), verifyTime)
		_, err := v.Verify(ctx, ev, someBinding, nil)
		wantRefusal(t, err, latchkeyv1.Reason_COLLATERAL_MISSING, "no tcbinfo-50806f000000.json in the collateral cache")
	})
	t.Run("stale QE identity", func(t *testing.T) {
		// The QE identity's next update (2023-07-08) passes first.
		v := newRealValidator(t, realPolicy(), dir, time.Date(2023, time.July, 9, 0, 0, 0, 0, time.UTC))
		_, err := v.Verify(ctx, ev, someBinding, nil)
		wantRefusal(t, err, latchkeyv1.Reason_COLLATERAL_MISSING, "QE identity expired at 2023-07-08T07:24:59Z")
	})
	t.Run("stale TCB info", func(t *testing.T) {
		v := newRealValidator(t, realPolicy(), dir, time.Date(2023, time.July, 19, 0, 0, 0, 0, time.UTC))
		_, err := v.Verify(ctx, ev, someBinding, nil)
		wantRefusal(t, err, latchkeyv1.Reason_COLLATERAL_MISSING, "TCB info tcbinfo-50806f000000.json expired at 2023-07-18T08:42:58Z")
	})
	t.Run("expired PCK", func(t *testing.T) {
		v := newRealValidator(t, realPolicy(), dir, time.Date(2029, time.October, 1, 0, 0, 0, 0, time.UTC))
		_, err := v.Verify(ctx, ev, someBinding, nil)
		wantRefusal(t, err, latchkeyv1.Reason_UNTRUSTED_CHAIN, "PCK certificate does not chain to a trusted root: x509: certificate has expired")
	})
	t.Run("wrong root", func(t *testing.T) {
		p := realPolicy()
		p.TrustedRoots = []string{selfSignedCA(t)}
		v := newRealValidator(t, p, dir, verifyTime)
		_, err := v.Verify(ctx, ev, someBinding, nil)
		wantRefusal(t, err, latchkeyv1.Reason_UNTRUSTED_CHAIN, "PCK certificate does not chain to a trusted root")
	})
	t.Run("forged TCB info status", func(t *testing.T) {
		// Slip-past: raise the status of the level the platform meets;
		// the TCB info's signature no longer verifies.
		d := copyDir(t, dir)
		editFile(t, filepath.Join(d, TCBInfoFileName(realFMSPC)), `"tcbStatus":"OutOfDate"`, `"tcbStatus":"UpToDate"`)
		v := newRealValidator(t, realPolicy(), d, verifyTime)
		_, err := v.Verify(ctx, ev, someBinding, nil)
		wantRefusal(t, err, latchkeyv1.Reason_UNTRUSTED_CHAIN, "collateral: tcbInfo signature: does not verify")
	})
	t.Run("forged TCB info signer", func(t *testing.T) {
		d := copyDir(t, dir)
		if err := os.WriteFile(filepath.Join(d, TCBInfoFileName(realFMSPC)+issuerSuffix), []byte(selfSignedCA(t)), 0o644); err != nil {
			t.Fatal(err)
		}
		v := newRealValidator(t, realPolicy(), d, verifyTime)
		_, err := v.Verify(ctx, ev, someBinding, nil)
		wantRefusal(t, err, latchkeyv1.Reason_UNTRUSTED_CHAIN, `collateral: tcbInfo is signed by "test root", not "Intel SGX TCB Signing"`)
	})
	t.Run("forged PCK CRL", func(t *testing.T) {
		// Slip-past: an empty CRL of the attacker's own making, to hide a
		// revocation.
		d := copyDir(t, dir)
		if err := os.WriteFile(filepath.Join(d, PCKCRLFileName("platform")), selfSignedCRL(t), 0o644); err != nil {
			t.Fatal(err)
		}
		v := newRealValidator(t, realPolicy(), d, verifyTime)
		_, err := v.Verify(ctx, ev, someBinding, nil)
		wantRefusal(t, err, latchkeyv1.Reason_UNTRUSTED_CHAIN, `collateral: pckcrl-platform.der is not signed by "Intel SGX PCK Platform CA"`)
	})
}

func statusOf(s string) pcs.TcbComponentStatus { return pcs.TcbComponentStatus(s) }

func mustCollateral(t *testing.T, dir string) *Collateral {
	t.Helper()
	c, err := NewCollateral(CollateralConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

func editFile(t *testing.T, path, old, repl string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), old) {
		t.Fatalf("%s has no %q", path, old)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(b), old, repl, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
}

var testKey = func() *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	return k
}()

func testRoot(t *testing.T) *x509.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test root"},
		NotBefore: verifyTime.AddDate(-1, 0, 0), NotAfter: verifyTime.AddDate(10, 0, 0),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &testKey.PublicKey, testKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func selfSignedCA(t *testing.T) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: testRoot(t).Raw}))
}

func selfSignedCRL(t *testing.T) []byte {
	t.Helper()
	der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{
		Number: big.NewInt(1), ThisUpdate: verifyTime.AddDate(0, 0, -1), NextUpdate: verifyTime.AddDate(0, 1, 0),
	}, testRoot(t), testKey)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// TestCollateralCache: a verified item is reused only while its content
// is unchanged, and its dates are judged at every join.
func TestCollateralCache(t *testing.T) {
	dir := copyDir(t, collateralDir(t))
	now := verifyTime
	v := newRealValidator(t, realPolicy(), dir, verifyTime, WithClock(func() time.Time { return now }))
	ev := evidenceOf(t, realQuote)
	ctx := context.Background()
	if _, err := v.Verify(ctx, ev, someBinding, nil); err != nil {
		t.Fatal(err)
	}
	now = time.Date(2023, time.July, 19, 0, 0, 0, 0, time.UTC)
	_, err := v.Verify(ctx, ev, someBinding, nil)
	wantRefusal(t, err, latchkeyv1.Reason_COLLATERAL_MISSING, "expired at")
	now = verifyTime
	// A forged file written after a verified join is read and refused;
	// its size differs, so the file cache sees the change.
	editFile(t, filepath.Join(dir, TCBInfoFileName(realFMSPC)), `"tcbStatus":"OutOfDate"`, `"tcbStatus":"UpToDate" `)
	_, err = v.Verify(ctx, ev, someBinding, nil)
	wantRefusal(t, err, latchkeyv1.Reason_UNTRUSTED_CHAIN, "collateral: tcbInfo signature: does not verify")
}
