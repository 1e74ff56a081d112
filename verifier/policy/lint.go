package policy

import (
	"fmt"
	"slices"
)

// resettablePCRs can be reset or extended by software at any time (PCR 16
// is the debug PCR, 23 the application PCR, both resettable from locality
// 0): a reference value for them proves nothing about the boot.
var resettablePCRs = []int{16, 23}

// Lint lists what makes a valid policy useless or unsafe, for `policy
// check` to refuse before it is deployed. The verifier itself loads such
// a policy (it is well-formed, and refusing it at a reload would keep the
// previous one in force without anyone asking), but nobody should write
// one:
//   - a TPM section that trusts no key (no EK CA, EK hash or AK pin):
//     every join is refused;
//   - a TPM section that checks no measurement (no PCR, no boot
//     components): every genuine TPM is admitted whatever it runs;
//   - a reference value for a software-resettable PCR;
//   - an SNP section that lists no launch measurement and no ID key;
//   - a TDX section that lists no MRTD (every TDX join is refused), that
//     allows debug TDs (the host can read their memory), whose boot
//     component policy lists no UKI and no boot loader (every TD that
//     loads an EFI application is refused), or that judges RTMRs by
//     components but lists no RTMR[0] value (the firmware always
//     extends RTMR[0], so every join is refused).
func Lint(p *Policy) []string {
	var out []string
	if t := p.TPM; t != nil {
		if len(t.EKCARoots) == 0 && len(t.EKPublicKeyHashes) == 0 && len(t.AKPublicKeyHashes) == 0 {
			out = append(out, "tpm: trusts no key (set ekCARoots, ekPublicKeyHashes or akPublicKeyHashes): every TPM join would be refused")
		}
		if len(t.PCRs) == 0 && t.Boot == nil {
			out = append(out, "tpm: checks no measurement (no pcrs and no boot components): any machine with a trusted TPM would be admitted, whatever it runs")
		}
		for _, idx := range resettablePCRs {
			if _, ok := t.PCRs[idx]; ok {
				out = append(out, fmt.Sprintf("tpm: pcrs.%d can be reset by software at any time; a value for it proves nothing (remove it)", idx))
			}
		}
		for idx := range t.PCRs {
			if idx < 0 || idx > 23 {
				out = append(out, fmt.Sprintf("tpm: pcrs.%d does not exist (PCRs are 0 to 23)", idx))
			}
		}
	}
	if s := p.SNP; s != nil && len(s.Measurements) == 0 && len(s.IDKeyDigests) == 0 && len(s.AuthorKeyDigests) == 0 {
		out = append(out, "snp: lists no launch measurement and no ID or author key: any SEV-SNP guest would be admitted, whatever it runs")
	}
	if x := p.TDX; x != nil {
		if len(x.MRTDs) == 0 {
			out = append(out, "tdx: lists no MRTD: every TDX join would be refused")
		}
		if x.AllowDebug {
			out = append(out, "tdx: allowDebug admits debug TDs, whose memory and registers the host can read")
		}
		if x.Boot != nil && len(x.Boot.UKIs) == 0 && len(x.Boot.BootLoaders) == 0 {
			out = append(out, "tdx: boot lists no ukis and no bootLoaders: every TD whose firmware loads an EFI application would be refused")
		}
		if x.Boot != nil && len(x.Boot.JudgedRTMRs) > 0 && (len(x.RTMRs) == 0 || len(x.RTMRs[0]) == 0) {
			out = append(out, "tdx: boot.judgedRTMRs judges RTMR[1]/RTMR[2] but rtmrs lists no RTMR[0] value: RTMR[0] must be all zeros, which no TD firmware leaves it, so every TDX join would be refused")
		}
	}
	slices.Sort(out)
	return out
}
