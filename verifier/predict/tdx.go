package predict

import (
	"bytes"
	"crypto/sha512"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"unicode/utf16"

	"github.com/google/go-tdx-guest/abi"
	pb "github.com/google/go-tdx-guest/proto/tdx"
	"sigs.k8s.io/yaml"

	"github.com/latchkey/latchkey/attest/tdx"
	"github.com/latchkey/latchkey/attest/tdx/wire"
)

// TDXOptions are the artefacts of a TDX prediction.
type TDXOptions struct {
	// UKI, BootLoaders, Cmdlines, Stub and SecureBootOff are as in
	// Options; digests are SHA-384 (RTMRs).
	UKI           string
	BootLoaders   []string
	Cmdlines      []string
	Stub          Stub
	SecureBootOff bool
	// ReferenceCCEL is the CC event log of a reference boot of the same
	// TD configuration (the guest's /sys/firmware/acpi/tables/data/CCEL),
	// from which RTMR[0..2] are predicted; "" predicts no RTMR.
	ReferenceCCEL string
	// ReferenceQuote is a TD quote of that reference boot (raw, as the
	// issuer gets it): its MRTD is listed as it is, and the reference
	// log must replay to its RTMRs. "" lists no MRTD.
	ReferenceQuote string
	// JudgeRTMRs predicts the judged form: RTMR[1] and RTMR[2] in
	// boot.judgedRTMRs instead of values, only rtmrs[0] listed, and the
	// reference's RTMR[2] measurements the verifier cannot read (the
	// kernel's initrd measurement), this boot's in their place, in
	// boot.extraMeasurements.
	JudgeRTMRs bool
}

// TDXSnippet is the part of the verifier's policy file a TDX prediction
// fills.
type TDXSnippet struct {
	APIVersion string      `json:"apiVersion"`
	TDX        *tdx.Policy `json:"tdx"`
}

// PredictTDX returns the tdx policy snippet a TD booting the artefacts
// passes. What is predicted from what (docs/configuration.md):
//
//   - boot.ukis, boot.bootLoaders: the SHA-384 Authenticode digests of
//     the files; kernelCmdlines as Predict's.
//   - RTMR[1], RTMR[2] (with ReferenceCCEL): the reference boot's
//     events, with its boot applications replaced in order by the boot
//     loaders then the UKI (the reference must have booted as many),
//     its systemd-stub section pairs by the UKI's sections, its passed
//     command line by each given one (one RTMR[2] value each), and an
//     unexplained measurement equal to a reference section's contents
//     (the kernel's measurement of the .initrd it was given) by the new
//     section's. Everything else (separators, EFI actions, the
//     partition table, other loaders' measurements) is the reference's.
//   - RTMR[0]: the reference log's value as it is (firmware
//     configuration, Secure Boot variables: they do not depend on the
//     UKI); RTMR[3] stays zero.
//   - MRTD: the reference quote's. MRTD is the TD firmware image as the
//     host loaded it, predicted here only by being observed: computing it
//     from a TDVF image is not implemented.
func PredictTDX(o TDXOptions) (*TDXSnippet, *UKI, error) {
	if o.UKI == "" {
		return nil, nil, fmt.Errorf("predict: no uki given")
	}
	if o.Stub == "" {
		o.Stub = Stub252
	}
	img, u, err := readUKIFile(o.UKI, o.Stub)
	if err != nil {
		return nil, nil, err
	}
	ukiDigest, err := Authenticode384(img)
	if err != nil {
		return nil, nil, fmt.Errorf("predict: %s: %w", o.UKI, err)
	}
	bp := &tdx.BootPolicy{UKIs: []string{digest384(ukiDigest)}}
	bp.SecureBoot.AllowDisabled = o.SecureBootOff
	chain, err := imageDigests(o.BootLoaders, Authenticode384)
	if err != nil {
		return nil, nil, err
	}
	for _, d := range chain {
		bp.BootLoaders = append(bp.BootLoaders, digest384(d))
	}
	chain = append(chain, ukiDigest)
	p := &tdx.Policy{Boot: bp, KernelCmdlines: cmdlinesFor(u, o.Cmdlines)}
	if o.ReferenceCCEL != "" {
		raw, err := readImage(o.ReferenceCCEL)
		if err != nil {
			return nil, nil, err
		}
		if p.RTMRs, err = PredictRTMRs(wire.TrimCCEL(raw), chain, u, o.Cmdlines); err != nil {
			return nil, nil, fmt.Errorf("predict: %s: %w", o.ReferenceCCEL, err)
		}
		if o.JudgeRTMRs {
			p.RTMRs = p.RTMRs[:1]
			if bp.ExtraMeasurements, err = predictExtras(wire.TrimCCEL(raw), chain, u); err != nil {
				return nil, nil, fmt.Errorf("predict: %s: %w", o.ReferenceCCEL, err)
			}
		}
		if o.ReferenceQuote != "" {
			if p.MRTDs, err = referenceMRTD(o.ReferenceQuote, wire.TrimCCEL(raw)); err != nil {
				return nil, nil, err
			}
		}
	} else if o.ReferenceQuote != "" {
		return nil, nil, fmt.Errorf("predict: a reference quote needs its reference ccel")
	}
	if o.JudgeRTMRs {
		bp.JudgedRTMRs = []int{1, 2}
	}
	return &TDXSnippet{APIVersion: "latchkey/v1", TDX: p}, u, nil
}

// referenceMRTD reads the quote's MRTD after checking the reference log
// replays to its RTMRs: a log and quote of different boots are refused.
func referenceMRTD(path string, log []byte) ([]string, error) {
	raw, err := readImage(path)
	if err != nil {
		return nil, err
	}
	q, err := abi.QuoteToProto(raw[:wire.QuoteLength(raw)])
	if err != nil {
		return nil, fmt.Errorf("predict: %s: %w", path, err)
	}
	qv4, ok := q.(*pb.QuoteV4)
	if !ok {
		return nil, fmt.Errorf("predict: %s: not a version 4 TD quote", path)
	}
	got, err := ReplayRTMRs(log)
	if err != nil {
		return nil, fmt.Errorf("predict: %w", err)
	}
	for i, r := range qv4.GetTdQuoteBody().GetRtmrs() {
		if !bytes.Equal(got[i][:], r) {
			return nil, fmt.Errorf("predict: the reference ccel replays RTMR[%d] to %x, the reference quote holds %x: not the same boot", i, got[i], r)
		}
	}
	return []string{hex.EncodeToString(qv4.GetTdQuoteBody().GetMrTd())}, nil
}

// ReplayRTMRs folds a CC event log into the four RTMRs, unchanged.
func ReplayRTMRs(log []byte) ([4][sha512.Size384]byte, error) {
	events, _, err := tdx.ReadLog(log)
	if err != nil {
		return [4][sha512.Size384]byte{}, err
	}
	return fold(events), nil
}

func fold(events []tdx.LoggedEvent) [4][sha512.Size384]byte {
	var v [4][sha512.Size384]byte
	for _, e := range events {
		v[e.RTMR] = sha512.Sum384(append(v[e.RTMR][:], e.Digest[:]...))
	}
	return v
}

// PredictRTMRs is the RTMR part of PredictTDX: per-RTMR lists of
// accepted values (RTMR[3] none: zero), from a reference log, the
// Authenticode digests of the boot chain (boot loaders, then the UKI),
// the UKI, and the command lines passed to it.
func PredictRTMRs(log []byte, chain [][sha512.Size384]byte, u *UKI, cmdlines []string) ([][]string, error) {
	events, ref, err := tdx.ReadLog(log)
	if err != nil {
		return nil, err
	}
	if len(ref.Applications) != len(chain) {
		return nil, fmt.Errorf("the reference boot loaded %d applications, the prediction boots %d (boot loaders and the uki)", len(ref.Applications), len(chain))
	}
	if len(ref.UKISections) == 0 {
		return nil, fmt.Errorf("the reference boot ran no systemd-stub (no section measurements in RTMR[2])")
	}
	if len(cmdlines) > 0 && !ref.CmdlinePassed {
		return nil, fmt.Errorf("the reference boot passed no command line to the uki; predict one without --cmdline")
	}
	if len(cmdlines) == 0 && ref.CmdlinePassed {
		return nil, fmt.Errorf("the reference boot passed the command line %q to the uki; give the ones to predict with --cmdline", ref.Cmdline)
	}
	if len(cmdlines) == 0 {
		cmdlines = []string{""}
	}
	out := make([][]string, 3)
	for _, cl := range cmdlines {
		v := fold(substitute(events, ref, chain, u, cl))
		for i := range out {
			h := hex.EncodeToString(v[i][:])
			if !contains(out[i], h) {
				out[i] = append(out[i], h)
			}
		}
	}
	return out, nil
}

// predictExtras are the RTMR[2] measurements of the reference boot the
// verifier cannot read, with this boot's in their place (as substitute
// makes them), for boot.extraMeasurements.
func predictExtras(log []byte, chain [][sha512.Size384]byte, u *UKI) ([]string, error) {
	events, ref, err := tdx.ReadLog(log)
	if err != nil {
		return nil, err
	}
	if len(ref.Applications) != len(chain) {
		return nil, fmt.Errorf("the reference boot loaded %d applications, the prediction boots %d (boot loaders and the uki)", len(ref.Applications), len(chain))
	}
	var out []string
	for _, e := range substitute(events, ref, chain, u, "") {
		if e.Role == tdx.RoleUnexplained && !contains(out, digest384(e.Digest)) {
			out = append(out, digest384(e.Digest))
		}
	}
	return out, nil
}

// substitute is the reference's events with the predicted boot's
// measurements in place of the reference boot's (see PredictTDX).
func substitute(events []tdx.LoggedEvent, ref *tdx.Boot, chain [][sha512.Size384]byte, u *UKI, cmdline string) []tdx.LoggedEvent {
	refSections := map[[sha512.Size384]byte]string{}
	for _, s := range ref.UKISections {
		refSections[s.Digest] = s.Name
	}
	var out []tdx.LoggedEvent
	app, stubDone := 0, false
	for _, e := range events {
		switch e.Role {
		case tdx.RoleApplication:
			e.Digest = chain[app]
			app++
		case tdx.RoleSectionName, tdx.RoleSectionData:
			if !stubDone {
				out = append(out, u.sectionEvents384(e.RTMR)...)
				stubDone = true
			}
			continue
		case tdx.RoleCmdline:
			e.Digest = sha512.Sum384(utf16z(cmdline))
		case tdx.RoleUnexplained:
			if name, ok := refSections[e.Digest]; ok {
				if s, ok := u.section(name); ok {
					e.Digest = sha512.Sum384(s.Data)
				}
			}
		}
		out = append(out, e)
	}
	return out
}

// sectionEvents384 are systemd-stub's RTMR[2] measurements of u.
func (u *UKI) sectionEvents384(rtmr int) []tdx.LoggedEvent {
	var out []tdx.LoggedEvent
	for _, s := range u.Sections {
		out = append(out,
			tdx.LoggedEvent{RTMR: rtmr, Digest: sha512.Sum384(append([]byte(s.Name), 0))},
			tdx.LoggedEvent{RTMR: rtmr, Digest: sha512.Sum384(s.Data)})
	}
	return out
}

func (u *UKI) section(name string) (Section, bool) {
	for _, s := range u.Sections {
		if s.Name == name {
			return s, true
		}
	}
	return Section{}, false
}

// utf16z is s as UTF-16LE with its NUL, as systemd-stub measures the
// command line it was passed.
func utf16z(s string) []byte {
	var b []byte
	for _, c := range utf16.Encode([]rune(s + "\x00")) {
		b = binary.LittleEndian.AppendUint16(b, c)
	}
	return b
}

func digest384(d [sha512.Size384]byte) string { return "sha384:" + hex.EncodeToString(d[:]) }

// WriteTDX prints s as YAML with a comment saying what was predicted.
func WriteTDX(w io.Writer, s *TDXSnippet, u *UKI) error {
	out, err := yaml.Marshal(s)
	if err != nil {
		return fmt.Errorf("predict: %w", err)
	}
	var b strings.Builder
	b.WriteString("# latchkey-verifier policy predict --variant tdx: reference values of a TD booting these artefacts.\n")
	b.WriteString("# Paste into the policy's tdx section (next to its tcbStatuses and trustedRoots).\n")
	b.WriteString("# boot.ukis/bootLoaders are the files' SHA-384 Authenticode digests.\n")
	if s.TDX.Boot != nil && len(s.TDX.Boot.JudgedRTMRs) > 0 {
		b.WriteString("# --judge-rtmrs: boot.judgedRTMRs has tdx.boot judge RTMR[1] and [2] (no values listed for them);\n")
		b.WriteString("# every event in them must be explained by ukis, bootLoaders, kernelCmdlines or extraMeasurements.\n")
		if len(s.TDX.RTMRs) == 0 {
			b.WriteString("# No RTMR[0] predicted (no --reference-ccel): list rtmrs[0], or every TD is refused.\n")
		}
	} else if len(s.TDX.RTMRs) == 0 {
		b.WriteString("# No RTMR predicted (no --reference-ccel): list rtmrs, or the policy requires them all zero.\n")
	} else {
		b.WriteString("# rtmrs[0] is the reference boot's; rtmrs[1] and [2] are the reference's events with this\n")
		b.WriteString("# boot chain, uki sections and command line in place of the reference's.\n")
	}
	if len(s.TDX.MRTDs) == 0 {
		b.WriteString("# No MRTD (no --reference-quote): list the TD firmware's MRTD from a quote of it.\n")
	} else {
		b.WriteString("# mrtds is the reference quote's (observed, not computed from the firmware image).\n")
	}
	b.WriteString("# Secure Boot stays required unless --secure-boot-off: list the db certificates\n")
	b.WriteString("# under tdx.boot.secureBoot.dbCertificates.\n")
	for _, s := range u.Sections {
		fmt.Fprintf(&b, "#   uki section %-9s %d bytes\n", s.Name, len(s.Data))
	}
	b.Write(out)
	_, err = io.WriteString(w, b.String())
	return err
}
