package tdx

import (
	"crypto/sha512"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/attest/tdx/tdxtest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// judge drops the RTMR[1] and RTMR[2] values the fixture pins and has
// the boot policy judge both.
func judge(p *Policy) {
	p.RTMRs = p.RTMRs[:1]
	p.Boot.JudgedRTMRs = []int{1, 2}
}

func TestJudgedRTMRs(t *testing.T) {
	f := newUKIFixture(t)
	upgraded := f.boot
	upgraded.UKI = sha512.Sum384([]byte("the upgraded uki"))
	upgraded.Sections = append([]tdxtest.Section(nil), f.boot.Sections...)
	upgraded.Sections[0].Data = []byte("new kernel")
	listUpgrade := func(p *Policy) {
		judge(p)
		p.Boot.UKIs = append(p.Boot.UKIs, name384(upgraded.UKI))
	}
	t.Run("listed uki, new RTMR values, none pinned", func(t *testing.T) {
		if tdxtest.TDVFLog(upgraded).RTMRs[1] == tdxtest.TDVFLog(f.boot).RTMRs[1] {
			t.Fatal("the upgrade does not change RTMR[1]")
		}
		ver, err := f.run(t, upgraded, upgraded, listUpgrade)
		if err != nil {
			t.Fatalf("Validate: %v", err)
		}
		if b := ver.State.(*State).Boot; b.Applications[1].Digest != upgraded.UKI {
			t.Fatalf("boot view %+v", b)
		}
	})
	t.Run("unlisted uki", func(t *testing.T) {
		_, err := f.run(t, upgraded, upgraded, judge)
		wantRefusal(t, err, latchkeyv1.Reason_COMPONENT_NOT_ALLOWED, "uki "+name384(upgraded.UKI)+" in rtmr 1 is not allowed")
	})
	t.Run("log edited to the listed uki, quote kept", func(t *testing.T) {
		_, err := f.run(t, upgraded, f.boot, judge)
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "CC event log:")
	})
	t.Run("no log", func(t *testing.T) {
		x := newSigned(t, tdxtest.Collateral{}, func(p *Policy) { f.policy(p); judge(p); p.KernelCmdlines = nil })
		_, err := x.validateWithLog(t, x.s.Body(), nil, nil)
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "RTMR[1] is judged by boot components (boot.judgedRTMRs) and no replayed CC event log accounts for it")
	})
	t.Run("log without the judged RTMR's events", func(t *testing.T) {
		// go-eventlog passes an RTMR the log has no event for, whatever
		// its value: a TD that loaded an unlisted boot loader sends a log
		// holding none of RTMR[1]'s events, which a loader-only policy
		// would otherwise accept.
		evil := f.boot
		evil.Loaders, evil.Sections, evil.SecureBoot = [][48]byte{sha512.Sum384([]byte("unlisted loader"))}, nil, false
		stripped := tdxtest.NewCCEL()
		_, err := f.runLogs(t, tdxtest.TDVFLog(evil), stripped, func(p *Policy) {
			p.RTMRs = [][]string{p.RTMRs[0], nil, p.RTMRs[2]}
			p.KernelCmdlines = nil
			p.Boot = &BootPolicy{BootLoaders: []string{name384(f.loader)}, SecureBoot: SecureBootPolicy{AllowDisabled: true}, JudgedRTMRs: []int{1}}
		})
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "RTMR[1] is judged by boot components (boot.judgedRTMRs) and no replayed CC event log accounts for it")
	})
}

// TestJudgedRTMRsRuntimeExtensions: the TD extends its own RTMRs and
// writes its own log, so after boot its OS can add events whose replay
// matches the quote. A judged RTMR refuses each one the policy does not
// explain.
func TestJudgedRTMRsRuntimeExtensions(t *testing.T) {
	f := newUKIFixture(t)
	t.Run("unexplained rtmr 2 measurement", func(t *testing.T) {
		added := f.boot
		added.Extra = [][48]byte{sha512.Sum384([]byte("whatever the OS measured"))}
		_, err := f.run(t, added, added, judge)
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "rtmr 2: measurement 7 ("+name384(added.Extra[0])+") is neither content-verified nor explained by the policy (boot.extraMeasurements)")
	})
	t.Run("section pair after the stub's", func(t *testing.T) {
		// A pair right after the stub's reads as one more of its
		// sections (see the residual risk in docs/measured-boot.md); one
		// naming a measured section, or after any other measurement,
		// refuses.
		l := tdxtest.TDVFLog(f.boot)
		l.Add(2, tdxtest.EvIPL, tdxtest.UTF16(".linux"), sha512.Sum384([]byte(".linux\x00")))
		l.Add(2, tdxtest.EvIPL, tdxtest.UTF16(".linux"), sha512.Sum384([]byte("another kernel")))
		_, err := f.runLogs(t, l, l, judge)
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "rtmr 2: section .linux measured twice (measurement 7)")
		passed := f.boot
		passed.Cmdline, passed.Passed = f.cmdline, true
		l = tdxtest.TDVFLog(passed)
		l.Add(2, tdxtest.EvIPL, tdxtest.UTF16(".ucode"), sha512.Sum384([]byte(".ucode\x00")))
		l.Add(2, tdxtest.EvIPL, tdxtest.UTF16(".ucode"), sha512.Sum384([]byte("microcode")))
		_, err = f.runLogs(t, l, l, judge)
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "rtmr 2: measurement 8 ("+name384(sha512.Sum384([]byte(".ucode\x00")))+") is neither content-verified nor explained by the policy")
	})
	t.Run("command line", func(t *testing.T) {
		l := tdxtest.TDVFLog(f.boot)
		l.AddData(2, tdxtest.EvIPL, tdxtest.UTF16("init=/bin/sh"))
		_, err := f.runLogs(t, l, l, judge)
		wantRefusal(t, err, latchkeyv1.Reason_CMDLINE_NOT_ALLOWED, `measured kernel command line "init=/bin/sh" is not in the policy`)
	})
	t.Run("application after ExitBootServices", func(t *testing.T) {
		// Even a listed digest: no firmware loads an application then.
		l := tdxtest.TDVFLog(f.boot)
		l.Add(1, tdxtest.EvEFIBootApp, make([]byte, 32), f.loader)
		_, err := f.runLogs(t, l, l, judge)
		wantRefusal(t, err, latchkeyv1.Reason_EVENT_LOG_MISMATCH, "rtmr 1: measurement 8 ("+name384(f.loader)+") follows ExitBootServices; a judged RTMR[1] admits no application the OS measured")
		if _, err := f.runLogs(t, l, l, nil); err != nil {
			t.Fatalf("pinned RTMRs: %v", err)
		}
	})
	t.Run("rtmr 3 is never judged", func(t *testing.T) {
		l := tdxtest.TDVFLog(f.boot)
		l.AddData(3, tdxtest.EvIPL, []byte("an application's measurement"))
		_, err := f.runLogs(t, l, l, func(p *Policy) { judge(p); p.RTMRs = p.RTMRs[:1] })
		wantRefusal(t, err, latchkeyv1.Reason_PCR_MISMATCH, "RTMR[3] ")
	})
}

func TestJudgedRTMRsPolicyErrors(t *testing.T) {
	uki := name384(sha512.Sum384([]byte("uki")))
	value := strings.Repeat("ab", measurementSize)
	for _, tc := range []struct {
		name string
		p    Policy
		want string
	}{
		{"rtmr 0", Policy{Boot: &BootPolicy{UKIs: []string{uki}, JudgedRTMRs: []int{0}}}, "tdx policy: boot.judgedRTMRs[0]: RTMR[0] cannot be judged by components (only 1 and 2)"},
		{"rtmr 3", Policy{Boot: &BootPolicy{UKIs: []string{uki}, JudgedRTMRs: []int{1, 3}}}, "tdx policy: boot.judgedRTMRs[1]: RTMR[3] cannot be judged by components (only 1 and 2)"},
		{"twice", Policy{Boot: &BootPolicy{UKIs: []string{uki}, JudgedRTMRs: []int{2, 2}}}, "tdx policy: boot.judgedRTMRs[1]: RTMR[2] listed twice"},
		{"listed and judged", Policy{RTMRs: [][]string{nil, {value}}, Boot: &BootPolicy{UKIs: []string{uki}, JudgedRTMRs: []int{1}}}, "tdx policy: rtmrs[1]: RTMR[1] is judged by boot components (boot.judgedRTMRs); list values or judge it, not both"},
		{"rtmr 1 accept-all", Policy{KernelCmdlines: []string{"console=hvc0"}, Boot: &BootPolicy{JudgedRTMRs: []int{1}}}, "tdx policy: boot.judgedRTMRs: judging RTMR[1] needs boot.ukis or boot.bootLoaders"},
		{"rtmr 2 accept-all", Policy{Boot: &BootPolicy{BootLoaders: []string{uki}, JudgedRTMRs: []int{2}}}, "tdx policy: boot.judgedRTMRs: judging RTMR[2] needs boot.ukis or kernelCmdlines"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewValidator(tc.p, nil)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("NewValidator: %v, want %q", err, tc.want)
			}
		})
	}
	// Each rule's passing neighbour loads: an empty rtmrs list for a
	// judged RTMR, RTMR[2] judged by kernelCmdlines alone.
	ok := Policy{RTMRs: [][]string{nil, {}}, KernelCmdlines: []string{"console=hvc0"}, Boot: &BootPolicy{BootLoaders: []string{uki}, JudgedRTMRs: []int{1, 2}}}
	if _, err := NewValidator(ok, nil); err != nil {
		t.Fatalf("NewValidator: %v", err)
	}
}
