package snp_test

import (
	"context"
	"testing"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/attesttest"
	"github.com/latchkey/latchkey/attest/snp"
	"github.com/latchkey/latchkey/attest/snp/snptest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// CheckPolicy judges only a state Verify returned: a *snp.State built by
// hand with every exported field of an accepted one (what a caller could
// forge) is refused as INTERNAL, as are another package's state, a nil
// one and none.
func TestCheckPolicyRefusesStateVerifyDidNotReturn(t *testing.T) {
	s := snptest.New(t)
	v := newValidator(t, s.Policy(), nil)
	binding := newBinding(t)
	ver, err := v.Verify(context.Background(), s.Evidence(binding), binding, nil)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if err := v.CheckPolicy(ver.State); err != nil {
		t.Fatalf("CheckPolicy of the verified state: %v", err)
	}
	st := ver.State.(*snp.State)
	forged := &snp.State{ProductLine: st.ProductLine, SigningKey: st.SigningKey, ReportVersion: st.ReportVersion,
		ChipID: st.ChipID, Measurement: st.Measurement, ReportedTCB: st.ReportedTCB, ReportedTCBVersion: st.ReportedTCBVersion,
		GuestSVN: st.GuestSVN, GuestPolicy: st.GuestPolicy, VMPL: st.VMPL, PlatformInfo: st.PlatformInfo, HostData: st.HostData,
		FamilyID: st.FamilyID, ImageID: st.ImageID, IDKeyDigest: st.IDKeyDigest, AuthorKeyDigest: st.AuthorKeyDigest, ReportID: st.ReportID}
	for _, tc := range []struct {
		name string
		st   attest.State
		want string
	}{
		{"forged", forged, "INTERNAL: VARIANT_SNP policy step cannot judge a *snp.State state its Verify did not return"},
		{"none", nil, "INTERNAL: VARIANT_SNP policy step given no verified state"},
		{"nil snp state", (*snp.State)(nil), "INTERNAL: VARIANT_SNP policy step cannot judge a *snp.State state its Verify did not return"},
		{"claims snp", &attesttest.State{V: latchkeyv1.Variant_VARIANT_SNP},
			"INTERNAL: VARIANT_SNP policy step cannot judge a *attesttest.State state its Verify did not return"},
	} {
		err := v.CheckPolicy(tc.st)
		if attest.ReasonOf(err) != latchkeyv1.Reason_INTERNAL || err.Error() != tc.want {
			t.Errorf("%s: CheckPolicy = %v, want %q", tc.name, err, tc.want)
		}
	}
}
