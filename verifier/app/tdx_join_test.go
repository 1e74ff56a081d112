package app_test

import (
	"bytes"
	"context"
	"crypto/sha512"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest/tdx"
	"github.com/latchkey/latchkey/attest/tdx/issuer"
	"github.com/latchkey/latchkey/attest/tdx/tdxtest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// newTDXRig starts the assembled verifier with a tdx-only policy that
// trusts the fake chain of signer and lists mrtd (the signer's own MRTD
// when ""), with collateral fetched from the signer's fake PCS into
// tdxCollateralDir.
func newTDXRig(t *testing.T, signer *tdxtest.Signer, mrtd string) *rig {
	t.Helper()
	return newTDXRigWith(t, signer, mrtd, nil)
}

// newTDXRigWith is newTDXRig with the policy edited by edit.
func newTDXRigWith(t *testing.T, signer *tdxtest.Signer, mrtd string, edit func(*tdx.Policy)) *rig {
	t.Helper()
	body := signer.Body()
	if mrtd == "" {
		mrtd = hex.EncodeToString(body.GetMrTd())
	}
	pol := tdx.Policy{TrustedRoots: []string{signer.RootPEM()}, MRTDs: []string{mrtd}}
	for _, r := range body.GetRtmrs() {
		pol.RTMRs = append(pol.RTMRs, []string{hex.EncodeToString(r)})
	}
	if edit != nil {
		edit(&pol)
	}
	collDir := t.TempDir()
	now := time.Now()
	getter := signer.Getter(tdxtest.Collateral{IssueDate: now.AddDate(0, 0, -1), NextUpdate: now.AddDate(0, 1, 0)})
	if err := tdx.FetchCollateral(context.Background(), getter, pol, tdxtest.FMSPC, "platform", collDir, now); err != nil {
		t.Fatal(err)
	}
	_, cfg := verifierFiles(t, map[string]any{"tdx": pol}, randomSecret(), "test-cluster")
	cfg.TDXCollateralDir = collDir
	return startRig(t, nil, cfg)
}

func tdxIssuer(t *testing.T, signer *tdxtest.Signer) *issuer.Issuer {
	t.Helper()
	// No event log: the machine running the test may be a TD with one.
	none := filepath.Join(t.TempDir(), "none")
	iss, err := issuer.New(issuer.Config{QuoteProvider: signer.QuoteProvider(), CCELTable: none, CCELData: none})
	if err != nil {
		t.Fatal(err)
	}
	return iss
}

// TestTDXJoinEndToEnd: an agent with the TDX issuer over the fake signer
// joins the assembled verifier, and rejoins with the same disk key.
func TestTDXJoinEndToEnd(t *testing.T) {
	signer := tdxtest.New(t, time.Now())
	r := newTDXRig(t, signer, "")
	c := r.agent(t, tdxIssuer(t, signer), 30*time.Second)
	first, err := c.Get(context.Background(), worker())
	if err != nil {
		t.Fatal(err)
	}
	again := worker()
	again.Rejoin = true
	second, err := c.Get(context.Background(), again)
	if err != nil {
		t.Fatal(err)
	}
	if len(first.DiskKey) != 32 || !bytes.Equal(first.DiskKey, second.DiskKey) || first.Token == "" || second.Token != "" {
		t.Fatal("want a 32-byte key twice, a token on the first join only")
	}
	logs := r.logs.String()
	if !strings.Contains(logs, "variant=VARIANT_TDX evidence_digest=sha256:") || !strings.Contains(logs, "tdx-ppid:"+hex.EncodeToString(signer.PPID)) {
		t.Fatalf("audit log:\n%s", logs)
	}
}

func TestTDXMRTDNotAllowedReleasesNothing(t *testing.T) {
	signer := tdxtest.New(t, time.Now())
	r := newTDXRig(t, signer, strings.Repeat("ab", 48))
	r.refusedWith(t, tdxIssuer(t, signer), worker(), latchkeyv1.Reason_MEASUREMENT_NOT_ALLOWED)
}

func TestTDXEnabledOnlyByPolicy(t *testing.T) {
	signer := tdxtest.New(t, time.Now())
	tpmOnly := newRig(t, rigOpts{})
	tpmOnly.refusedWith(t, tdxIssuer(t, signer), worker(), latchkeyv1.Reason_UNKNOWN_VARIANT)
}

// ukiBootIssuer is a TDX issuer whose TD booted b: the signer quotes the
// RTMRs of b's synthesized CC event log, which the issuer sends.
func ukiBootIssuer(t *testing.T, signer *tdxtest.Signer, b tdxtest.UKIBoot) *issuer.Issuer {
	t.Helper()
	log := tdxtest.TDVFLog(b)
	signer.SetRTMRs(log.RTMRSlices())
	dir := t.TempDir()
	table, data := filepath.Join(dir, "table"), filepath.Join(dir, "data")
	if err := os.WriteFile(table, tdxtest.CCELTable(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(data, log.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	iss, err := issuer.New(issuer.Config{QuoteProvider: signer.QuoteProvider(), CCELTable: table, CCELData: data})
	if err != nil {
		t.Fatal(err)
	}
	return iss
}

// TestTDXComponentPolicyEndToEnd: a TD whose CC event log shows a listed
// UKI joins the assembled verifier under tdx.boot; one booting another
// UKI (its RTMRs listed all the same) is refused COMPONENT_NOT_ALLOWED.
func TestTDXComponentPolicyEndToEnd(t *testing.T) {
	good := tdxtest.UKIBoot{
		UKI:      sha512.Sum384([]byte("listed uki")),
		Sections: []tdxtest.Section{{Name: ".linux", Data: []byte("kernel")}},
	}
	bad := good
	bad.UKI = sha512.Sum384([]byte("another uki"))
	goodLog, badLog := tdxtest.TDVFLog(good), tdxtest.TDVFLog(bad)
	signer := tdxtest.New(t, time.Now())
	r := newTDXRigWith(t, signer, "", func(p *tdx.Policy) {
		p.RTMRs = make([][]string, 3)
		for i := range 3 {
			p.RTMRs[i] = []string{hex.EncodeToString(goodLog.RTMRs[i][:]), hex.EncodeToString(badLog.RTMRs[i][:])}
		}
		p.Boot = &tdx.BootPolicy{UKIs: []string{"sha384:" + hex.EncodeToString(good.UKI[:])}, SecureBoot: tdx.SecureBootPolicy{AllowDisabled: true}}
	})
	if _, err := r.agent(t, ukiBootIssuer(t, signer, good), 30*time.Second).Get(context.Background(), worker()); err != nil {
		t.Fatalf("the listed uki's TD: %v", err)
	}
	r.refusedWithTokens(t, ukiBootIssuer(t, signer, bad), worker(), latchkeyv1.Reason_COMPONENT_NOT_ALLOWED, 1)
}

// TestTDXJudgedRTMRsEndToEnd: with RTMR[1] and RTMR[2] judged by
// tdx.boot and no value listed for them, a TD booting a listed UKI
// joins the assembled verifier whatever those registers hold, and one
// booting another UKI is refused COMPONENT_NOT_ALLOWED.
func TestTDXJudgedRTMRsEndToEnd(t *testing.T) {
	good := tdxtest.UKIBoot{
		UKI:      sha512.Sum384([]byte("listed uki")),
		Sections: []tdxtest.Section{{Name: ".linux", Data: []byte("kernel")}},
	}
	bad := good
	bad.UKI = sha512.Sum384([]byte("another uki"))
	goodLog := tdxtest.TDVFLog(good)
	signer := tdxtest.New(t, time.Now())
	r := newTDXRigWith(t, signer, "", func(p *tdx.Policy) {
		p.RTMRs = [][]string{{hex.EncodeToString(goodLog.RTMRs[0][:])}}
		p.Boot = &tdx.BootPolicy{
			UKIs:        []string{"sha384:" + hex.EncodeToString(good.UKI[:])},
			SecureBoot:  tdx.SecureBootPolicy{AllowDisabled: true},
			JudgedRTMRs: []int{1, 2},
		}
	})
	if _, err := r.agent(t, ukiBootIssuer(t, signer, good), 30*time.Second).Get(context.Background(), worker()); err != nil {
		t.Fatalf("the listed uki's TD: %v", err)
	}
	r.refusedWithTokens(t, ukiBootIssuer(t, signer, bad), worker(), latchkeyv1.Reason_COMPONENT_NOT_ALLOWED, 1)
}
