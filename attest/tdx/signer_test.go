package tdx

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tdx/tdxtest"
	"github.com/latchkey/latchkey/attest/tdx/wire"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// signed is a validator over the fake signer's chain and collateral (via
// FetchCollateral, as from Intel PCS) at verifyTime.
type signed struct {
	s *tdxtest.Signer
	v *Validator
}

func newSigned(t *testing.T, c tdxtest.Collateral, edit func(*Policy), opts ...ValidatorOption) *signed {
	t.Helper()
	s := tdxtest.New(t, verifyTime)
	if c.IssueDate.IsZero() {
		c.IssueDate, c.NextUpdate = verifyTime.AddDate(0, 0, -1), verifyTime.AddDate(0, 1, 0)
	}
	p := Policy{TrustedRoots: []string{s.RootPEM()}, MRTDs: []string{hex.EncodeToString(s.Body().GetMrTd())}}
	for _, r := range s.Body().GetRtmrs() {
		p.RTMRs = append(p.RTMRs, []string{hex.EncodeToString(r)})
	}
	dir := t.TempDir()
	if err := FetchCollateral(context.Background(), s.Getter(c), p, tdxtest.FMSPC, "platform", dir, verifyTime); err != nil {
		t.Fatalf("FetchCollateral: %v", err)
	}
	if edit != nil {
		edit(&p)
	}
	v, err := NewValidator(p, mustCollateral(t, dir), append([]ValidatorOption{WithClock(func() time.Time { return verifyTime })}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return &signed{s: s, v: v}
}

func (x *signed) validate(t *testing.T, debug bool) (*attest.Verified, error) {
	t.Helper()
	binding := bytes.Repeat([]byte{0x42}, attest.BindingSize)
	rd, _ := wire.ReportData(binding)
	body := x.s.Body()
	if debug {
		body.TdAttributes[0] |= 1
	}
	return attest.Validate(context.Background(), x.v, evidenceOf(t, x.s.Quote(body, rd)), binding, nil)
}

// TestSignedAccepted: a quote of the fake chain, with current collateral
// and the policy's values, passes every check of Verify and CheckPolicy.
func TestSignedAccepted(t *testing.T) {
	x := newSigned(t, tdxtest.Collateral{}, nil)
	ver, err := x.validate(t, false)
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	st := ver.State.(*State)
	if ver.MachineID != "tdx-ppid:"+hex.EncodeToString(x.s.PPID) || st.PlatformTCBStatus != "UpToDate" || st.QETCBStatus != "UpToDate" {
		t.Fatalf("MachineID %q, statuses %s/%s", ver.MachineID, st.PlatformTCBStatus, st.QETCBStatus)
	}
}

func TestSignedRefusals(t *testing.T) {
	tests := []struct {
		name   string
		coll   tdxtest.Collateral
		edit   func(*Policy)
		debug  bool
		reason latchkeyv1.Reason
		detail string
	}{
		{"revoked PCK", tdxtest.Collateral{RevokePCK: true}, nil, false, latchkeyv1.Reason_UNTRUSTED_CHAIN, "PCK certificate %s is revoked"},
		{"revoked PCK CA", tdxtest.Collateral{RevokeInter: true}, nil, false, latchkeyv1.Reason_UNTRUSTED_CHAIN, "PCK CA certificate %s is revoked"},
		{"revoked TCB signer", tdxtest.Collateral{RevokeTCBSigner: true}, nil, false, latchkeyv1.Reason_UNTRUSTED_CHAIN, "TCB signing certificate %s is revoked"},
		{"SWHardeningNeeded not listed", tdxtest.Collateral{TCBStatus: "SWHardeningNeeded"}, nil, false, latchkeyv1.Reason_TCB_TOO_OLD,
			"platform TCB status SWHardeningNeeded is not accepted by the policy"},
		{"SWHardeningNeeded listed", tdxtest.Collateral{TCBStatus: "SWHardeningNeeded"},
			func(p *Policy) { p.TCBStatuses = []string{"UpToDate", "SWHardeningNeeded"} }, false, latchkeyv1.Reason_REASON_UNSPECIFIED, ""},
		{"platform out of date", tdxtest.Collateral{TCBStatus: "OutOfDate"}, nil, false, latchkeyv1.Reason_TCB_TOO_OLD, "platform TCB status OutOfDate"},
		{"platform revoked", tdxtest.Collateral{TCBStatus: "Revoked"}, func(p *Policy) { p.TCBStatuses = []string{"OutOfDate"} }, false,
			latchkeyv1.Reason_TCB_TOO_OLD, "platform TCB status Revoked"},
		{"QE out of date", tdxtest.Collateral{QEStatus: "OutOfDate"}, nil, false, latchkeyv1.Reason_TCB_TOO_OLD, "quoting enclave TCB status OutOfDate"},
		{"debug TD", tdxtest.Collateral{}, nil, true, latchkeyv1.Reason_DEBUG_POLICY, "allow debugging"},
		{"debug TD allowed", tdxtest.Collateral{}, func(p *Policy) { p.AllowDebug = true }, true, latchkeyv1.Reason_REASON_UNSPECIFIED, ""},
		{"Intel root only", tdxtest.Collateral{}, func(p *Policy) { p.TrustedRoots = nil }, false, latchkeyv1.Reason_UNTRUSTED_CHAIN,
			"PCK certificate does not chain to a trusted root"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x := newSigned(t, tc.coll, tc.edit)
			_, err := x.validate(t, tc.debug)
			if tc.reason == latchkeyv1.Reason_REASON_UNSPECIFIED {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			detail := tc.detail
			switch tc.name {
			case "revoked PCK":
				detail = fmt.Sprintf(detail, x.s.PCK.SerialNumber.Text(16))
			case "revoked PCK CA":
				detail = fmt.Sprintf(detail, x.s.Inter.SerialNumber.Text(16))
			case "revoked TCB signer":
				detail = fmt.Sprintf(detail, x.s.TCBSign.SerialNumber.Text(16))
			}
			wantRefusal(t, err, tc.reason, detail)
		})
	}
}

// TestSignedExpiry: the PCK certificate past its NotAfter, collateral past
// its next update.
func TestSignedExpiry(t *testing.T) {
	x := newSigned(t, tdxtest.Collateral{}, nil)
	x.v.now = func() time.Time { return verifyTime.AddDate(0, 2, 0) }
	_, err := x.validate(t, false)
	wantRefusal(t, err, latchkeyv1.Reason_COLLATERAL_MISSING, "expired at")
	x.v.now = func() time.Time { return verifyTime.AddDate(1, 0, 1) }
	_, err = x.validate(t, false)
	wantRefusal(t, err, latchkeyv1.Reason_UNTRUSTED_CHAIN, "PCK certificate does not chain to a trusted root: x509: certificate has expired")
}

// TestSignedBinding: a genuine quote made for another session.
func TestSignedBinding(t *testing.T) {
	x := newSigned(t, tdxtest.Collateral{}, nil)
	rd, _ := wire.ReportData(bytes.Repeat([]byte{1}, attest.BindingSize))
	_, err := x.v.Verify(context.Background(), evidenceOf(t, x.s.Quote(x.s.Body(), rd)), bytes.Repeat([]byte{2}, attest.BindingSize), nil)
	wantRefusal(t, err, latchkeyv1.Reason_BINDING_MISMATCH, "REPORTDATA is not this session's binding")
}
