package tpm_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"
	"sigs.k8s.io/yaml"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tpm"
	"github.com/latchkey/latchkey/attest/tpm/bootlog"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
)

// The metamorphic test of the event-log rule: a machine controls its
// logs, not its PCRs, so every edit that keeps both logs replaying to the
// same quoted PCRs must leave the verified boot state and the decision
// exactly as they were, or be refused. The edits are generated over every
// corpus the tests have, not chosen case by case.

// fwEvent is one firmware log event as the log encodes it: everything
// but the digest is the machine's to rewrite.
type fwEvent struct {
	pcr    int
	typ    uint32
	data   []byte
	digest [32]byte
}

// sdRecord is one record of systemd's log; again only the digest is
// measured.
type sdRecord struct {
	pcr    int
	digest [32]byte
	str    string
	typ    string
}

// logs is a pair of logs under edit.
type logs struct {
	fw []fwEvent
	sd []sdRecord
}

func (l logs) clone() logs {
	return logs{fw: slices.Clone(l.fw), sd: slices.Clone(l.sd)}
}

func (l logs) fwBytes() []byte {
	out := tpmtest.NewFirmwareLog()
	for _, e := range l.fw {
		out.Add(e.pcr, e.typ, e.data, e.digest)
	}
	return out.Bytes()
}

func (l logs) sdBytes() []byte {
	var b bytes.Buffer
	for _, r := range l.sd {
		s, _ := json.Marshal(r.str)
		ty, _ := json.Marshal(r.typ)
		fmt.Fprintf(&b, "\x1e{\"pcr\":%d,\"digests\":[{\"hashAlg\":\"sha256\",\"digest\":\"%s\"}],\"content_type\":\"systemd\",\"content\":{\"string\":%s,\"eventType\":%s}}\n",
			r.pcr, hex.EncodeToString(r.digest[:]), s, ty)
	}
	return b.Bytes()
}

func parseLogs(t testing.TB, fw, sd []byte) logs {
	t.Helper()
	el, err := tcg.ParseEventLog(fw, tcg.ParseOpts{})
	if err != nil {
		t.Fatal(err)
	}
	var l logs
	for _, e := range el.Events(register.HashSHA256) {
		ev := fwEvent{pcr: e.Index, typ: uint32(e.Type), data: bytes.Clone(e.Data)}
		copy(ev.digest[:], e.Digest)
		l.fw = append(l.fw, ev)
	}
	for _, line := range bytes.Split(sd, []byte{0x1e}) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var r struct {
			PCR     int `json:"pcr"`
			Digests []struct {
				Digest string `json:"digest"`
			} `json:"digests"`
			Content struct {
				String    string `json:"string"`
				EventType string `json:"eventType"`
			} `json:"content"`
		}
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatal(err)
		}
		d, _ := hex.DecodeString(r.Digests[0].Digest)
		l.sd = append(l.sd, sdRecord{pcr: r.PCR, digest: [32]byte(d), str: r.Content.String, typ: r.Content.EventType})
	}
	return l
}

// corpus is one machine's evidence and the policy it is judged by.
type corpus struct {
	name  string
	m     *machine
	fw    []byte
	v     *tpm.Validator
	logs  logs
	phase string // the unlogged phase words, for the edits that log them
}

// outcome is what the verifier made of one evidence.
type outcome struct {
	boot   *bootlog.Boot
	reason string // "" when admitted
}

func (c *corpus) judge(t *testing.T, l logs) outcome {
	t.Helper()
	binding := newBinding(t)
	var sd []byte
	if len(l.sd) > 0 {
		sd = l.sdBytes()
	}
	ev := c.m.ak.evidenceWith(t, binding, craftOpts{pcrs: c.m.pcrs, fw: l.fwBytes(), sd: sd, sig: c.m.sig})
	ver, err := attest.Validate(context.Background(), c.v, ev, binding, noRoundTrip(t))
	if err != nil {
		return outcome{reason: err.Error()}
	}
	return outcome{boot: stateOf(t, ver).Boot}
}

// corpora are every event-log corpus of the tests: the real OVMF guest
// log, synthesized boots (pinned and signed UKI, systemd 252 unlogged and
// systemd 254+ logged phases, a passed command line, a measurement
// admitted by boot.extraMeasurements), a machine stopped in the initrd,
// and an init=/bin/sh boot.
func corpora(t testing.TB) []*corpus {
	t.Helper()
	der, pemText := dbCert(t, "metamorphic db")
	sg := newSigner(t)
	pinned := &tpm.BootPolicy{UKIs: []string{dgst(ukiDigest)}, BootLoaders: []string{dgst(loaderDigest)},
		SecureBoot: tpm.SecureBootPolicy{DBCertificates: []string{pemText}}}
	signed := &tpm.BootPolicy{BootLoaders: []string{dgst(loaderDigest)}, PCR11Signers: []string{sg.pem},
		SecureBoot: tpm.SecureBootPolicy{DBCertificates: []string{pemText}}}
	phases := func(words ...string) []tpmtest.SystemdRecord {
		var out []tpmtest.SystemdRecord
		for _, w := range words {
			out = append(out, tpmtest.SystemdRecord{PCR: 11, EventType: "phase", String: w})
		}
		return out
	}
	// signAll signs PCR 11 in every phase of the chain, as `systemd-measure
	// sign` does for a UKI.
	signAll := func(m *machine, b tpmtest.Boot) {
		base := tpmtest.OVMFLog(b).PCRs
		var values [][32]byte
		for i := range 4 {
			p := map[int][32]byte{11: base[11]}
			tpmtest.ExtendPhase(p, strings.Join(bootlog.StandardPhases[:i+1], ":"))
			values = append(values, p[11])
		}
		m.sig = sg.sign(t, values...)
	}
	passed := ukiBoot(t, der)
	passed.Cmdline, passed.Passed = "console=ttyS0", true
	initSh := ukiBoot(t, der)
	initSh.Cmdline, initSh.Passed = "console=ttyS0 init=/bin/sh", true
	passedPolicy := *pinned
	passedPolicy.KernelCmdlines = []string{"console=ttyS0", "console=ttyS0 ro"}

	var out []*corpus
	add := func(name string, m *machine, bp *tpm.BootPolicy, phase string) {
		fw := m.log.Bytes()
		if m.raw != nil {
			fw = m.raw
		}
		c := &corpus{name: name, m: m, fw: fw, phase: phase,
			v: newValidator(t, tpm.Policy{AKPublicKeyHashes: []string{m.ak.akHash}, Boot: bp})}
		c.logs = parseLogs(t, fw, m.sd)
		out = append(out, c)
	}
	real := realMachine(t)
	add("real ovmf guest", real, &tpm.BootPolicy{UKIs: []string{"sha256:" + realUKI}, KernelCmdlines: []string{realCmdline(t)},
		SecureBoot: tpm.SecureBootPolicy{AllowDisabled: true}, PCR11Phases: []string{"sysinit"}}, "sysinit")
	add("pinned uki, systemd 252", boot(t, ukiBoot(t, der), sysinit), pinned, sysinit)
	add("pinned uki, systemd log", boot(t, ukiBoot(t, der), "", append(phases("enter-initrd", "leave-initrd"),
		tpmtest.SystemdRecord{PCR: 15, EventType: "machine-id", String: "machine-id:0123"},
		tpmtest.SystemdRecord{PCR: 11, EventType: "phase", String: "sysinit"})...), pinned, "")
	signedLog := boot(t, ukiBoot(t, der), "", phases("enter-initrd", "leave-initrd", "sysinit")...)
	signAll(signedLog, ukiBoot(t, der))
	add("signed uki, systemd log", signedLog, signed, "")
	signed252 := boot(t, ukiBoot(t, der), sysinit)
	signAll(signed252, ukiBoot(t, der))
	add("signed uki, systemd 252", signed252, signed, sysinit)
	initrd := boot(t, ukiBoot(t, der), "", phases("enter-initrd")...)
	signAll(initrd, ukiBoot(t, der))
	add("stopped in the initrd", initrd, signed, "")
	add("passed command line", boot(t, passed, sysinit), &passedPolicy, sysinit)
	add("init=/bin/sh passed", boot(t, initSh, sysinit), pinned, sysinit)
	// A systemd-stub credential in PCR 12 (its digest the file's, its data
	// a name), admitted by digest, after the passed command line.
	withCred := boot(t, passed, sysinit)
	credential := sha256.Sum256([]byte("credential contents"))
	withCred.log.Add(12, tpmtest.EvIPL, tpmtest.UTF16("some.cred"), credential)
	withCred.pcrs[12] = withCred.log.PCRs[12]
	credPolicy := passedPolicy
	credPolicy.ExtraMeasurements = []string{dgst(credential)}
	add("credential allowed by digest", withCred, &credPolicy, sysinit)
	return out
}

func realMachine(t testing.TB) *machine {
	t.Helper()
	fw, err := os.ReadFile("testdata/ovmf-uki/binary_bios_measurements")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("testdata/ovmf-uki/latchkey-agent-measure.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		TPM tpm.Policy `json:"tpm"`
	}
	if err := yaml.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	pcrs := map[int][32]byte{}
	for idx, v := range m.TPM.PCRs {
		b, err := hex.DecodeString(v[0])
		if err != nil || len(b) != 32 {
			t.Fatalf("pcr %d: %q", idx, v[0])
		}
		pcrs[idx] = [32]byte(b)
	}
	l := tpmtest.NewFirmwareLog()
	mc := &machine{ak: newCrafted(t, true), pcrs: pcrs, log: l, raw: fw}
	parsed := parseLogs(t, fw, nil)
	for _, e := range parsed.fw {
		l.Add(e.pcr, e.typ, e.data, e.digest)
	}
	return mc
}

func realCmdline(t testing.TB) string {
	c, err := os.ReadFile("testdata/ovmf-uki/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	return string(c)
}

// edit is one rewrite of a corpus's logs.
type edit struct {
	name string
	logs logs
}

// TCG event types an edit relabels events to.
var relabels = []uint32{0x01, 0x04, 0x06, 0x08, 0x0c, 0x0d, tpmtest.EvEFIVariableConfig, tpmtest.EvEFIBootApp,
	tpmtest.EvEFIAction, tpmtest.EvEFIAuthority, 0x80000008, 0x80000009, 0x800000e1, 0x12345678}

// edits generates the rewrites of c's logs that keep every PCR's replay:
// content and data rewritten, event types and systemd labels relabelled,
// phase words rewritten, records reordered across PCRs (and within a PCR
// where two digests are equal), records moved between the firmware log
// and systemd's, no-action events added, and logged phase words folded
// into or split out of systemd 252's unlogged phase (the only split or
// merge a hash chain allows).
func (c *corpus) edits() []edit {
	var out []edit
	base := c.logs
	add := func(name string, f func(l *logs) bool) {
		l := base.clone()
		if f(&l) {
			out = append(out, edit{name, l})
		}
	}
	texts := [][]byte{[]byte("x"), nil, []byte("enter-initrd:leave-initrd:sysinit"), tpmtest.UTF16("enter-initrd:leave-initrd:sysinit"),
		[]byte("sysinit"), tpmtest.UTF16("console=ttyS0"), tpmtest.UTF16(".cmdline"), []byte("Calling EFI Application from Boot Option"),
		[]byte{0, 0, 0, 0}}
	for i, e := range base.fw {
		for j, d := range append(slices.Clone(texts), base.fw[(i+1)%len(base.fw)].data) {
			add(fmt.Sprintf("fw %d (pcr %d) data %d", i, e.pcr, j), func(l *logs) bool { l.fw[i].data = d; return true })
		}
		if e.typ == tpmtest.EvNoAction {
			continue
		}
		for _, ty := range relabels {
			add(fmt.Sprintf("fw %d (pcr %d) type %#x", i, e.pcr, ty), func(l *logs) bool { l.fw[i].typ = ty; return ty != e.typ })
		}
	}
	for i, r := range base.sd {
		for _, s := range []string{"enter-initrd:leave-initrd:sysinit", "sysinit", "ready", "", "x", base.sd[(i+1)%len(base.sd)].str} {
			add(fmt.Sprintf("sd %d (pcr %d) string %q", i, r.pcr, s), func(l *logs) bool { l.sd[i].str = s; return s != r.str })
		}
		for _, ty := range []string{"phase", "machine-id", "", "stub", "volume-key"} {
			add(fmt.Sprintf("sd %d (pcr %d) type %q", i, r.pcr, ty), func(l *logs) bool { l.sd[i].typ = ty; return ty != r.typ })
		}
	}
	out = append(out, c.reorders()...)
	out = append(out, c.moves()...)
	for _, pos := range []int{0, len(base.fw) / 2, len(base.fw)} {
		for j, d := range [][]byte{[]byte("StartupLocality\x00\x03"), []byte("x"), tpmtest.UTF16("sysinit")} {
			for _, pcr := range []int{0, 11} {
				add(fmt.Sprintf("no-action %d at %d in pcr %d", j, pos, pcr), func(l *logs) bool {
					l.fw = slices.Insert(l.fw, pos, fwEvent{pcr: pcr, typ: tpmtest.EvNoAction, data: d})
					return true
				})
			}
		}
	}
	out = append(out, c.phaseSplits()...)
	return out
}

// reorders swaps neighbours of different PCRs (their relative order is
// not measured), sorts each log by PCR both ways, and swaps events of one
// PCR with equal digests.
func (c *corpus) reorders() []edit {
	var out []edit
	base := c.logs
	for i := 0; i+1 < len(base.fw); i++ {
		if base.fw[i].pcr != base.fw[i+1].pcr {
			l := base.clone()
			l.fw[i], l.fw[i+1] = l.fw[i+1], l.fw[i]
			out = append(out, edit{fmt.Sprintf("fw swap %d,%d", i, i+1), l})
		}
		for j := i + 1; j < len(base.fw); j++ {
			if base.fw[i].pcr == base.fw[j].pcr && base.fw[i].digest == base.fw[j].digest && base.fw[i].typ != tpmtest.EvNoAction {
				l := base.clone()
				l.fw[i], l.fw[j] = l.fw[j], l.fw[i]
				out = append(out, edit{fmt.Sprintf("fw swap equal digests %d,%d", i, j), l})
			}
		}
	}
	for i := 0; i+1 < len(base.sd); i++ {
		if base.sd[i].pcr != base.sd[i+1].pcr {
			l := base.clone()
			l.sd[i], l.sd[i+1] = l.sd[i+1], l.sd[i]
			out = append(out, edit{fmt.Sprintf("sd swap %d,%d", i, i+1), l})
		}
	}
	for _, dir := range []int{1, -1} {
		l := base.clone()
		slices.SortStableFunc(l.fw, func(a, b fwEvent) int { return dir * (a.pcr - b.pcr) })
		slices.SortStableFunc(l.sd, func(a, b sdRecord) int { return dir * (a.pcr - b.pcr) })
		out = append(out, edit{fmt.Sprintf("sorted by pcr %+d", dir), l})
	}
	return out
}

// moves carries the last firmware event of each PCR over to the front of
// systemd's log and the first systemd record of each PCR to the end of the
// firmware log: the replay (firmware events, then systemd's) is the same.
func (c *corpus) moves() []edit {
	var out []edit
	base := c.logs
	seen := map[int]bool{}
	for i := len(base.fw) - 1; i >= 0; i-- {
		e := base.fw[i]
		if seen[e.pcr] || e.typ == tpmtest.EvNoAction {
			continue
		}
		seen[e.pcr] = true
		for _, typ := range []string{"phase", ""} {
			l := base.clone()
			l.fw = slices.Delete(l.fw, i, i+1)
			l.sd = slices.Insert(l.sd, 0, sdRecord{pcr: e.pcr, digest: e.digest, str: string(e.data), typ: typ})
			out = append(out, edit{fmt.Sprintf("fw %d (pcr %d) to systemd log as %q", i, e.pcr, typ), l})
		}
	}
	seen = map[int]bool{}
	for i, r := range base.sd {
		if seen[r.pcr] {
			continue
		}
		seen[r.pcr] = true
		for j, data := range [][]byte{[]byte(r.str), tpmtest.UTF16(r.str)} {
			l := base.clone()
			l.sd = slices.Delete(l.sd, i, i+1)
			l.fw = append(l.fw, fwEvent{pcr: r.pcr, typ: 0x0d, data: data, digest: r.digest})
			out = append(out, edit{fmt.Sprintf("sd %d (pcr %d) to firmware log, encoding %d", i, r.pcr, j), l})
		}
	}
	return out
}

// phaseSplits folds logged PCR 11 phase words into the unlogged phase of
// systemd 252 (all of them, or only the last), and logs unlogged words,
// with the right and with other labels.
func (c *corpus) phaseSplits() []edit {
	var out []edit
	base := c.logs
	var last = -1
	for i, r := range base.sd {
		if r.pcr == 11 {
			last = i
		}
	}
	if last >= 0 {
		l := base.clone()
		l.sd = slices.DeleteFunc(l.sd, func(r sdRecord) bool { return r.pcr == 11 })
		out = append(out, edit{"phase words unlogged", l})
		l = base.clone()
		l.sd = slices.Delete(l.sd, last, last+1)
		out = append(out, edit{"last phase word unlogged", l})
	}
	if c.phase != "" {
		for _, typ := range []string{"phase", "machine-id"} {
			l := base.clone()
			for _, w := range strings.Split(c.phase, ":") {
				l.sd = append(l.sd, sdRecord{pcr: 11, digest: sha256.Sum256([]byte(w)), str: w, typ: typ})
			}
			out = append(out, edit{"unlogged phase logged as " + typ, l})
		}
	}
	return out
}

// violation says why an edited evidence breaks the rule, or "".
func violation(orig, got outcome) string {
	switch {
	case got.reason != "":
		return ""
	case orig.reason != "":
		return "admitted, the original was refused: " + orig.reason
	case !reflect.DeepEqual(orig.boot, got.boot):
		return "admitted with another boot state: " + diffFields(*orig.boot, *got.boot)
	}
	return ""
}

// diffFields names the fields of two boot states that differ, with the
// edited value of the short ones.
func diffFields(a, b bootlog.Boot) string {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	var out []string
	for i := range va.NumField() {
		x, y := va.Field(i).Interface(), vb.Field(i).Interface()
		if reflect.DeepEqual(x, y) {
			continue
		}
		if s := fmt.Sprintf("%v", y); len(s) < 80 {
			out = append(out, fmt.Sprintf("%s %v -> %v", va.Type().Field(i).Name, x, y))
		} else {
			out = append(out, va.Type().Field(i).Name)
		}
	}
	return strings.Join(out, ", ")
}

// Every edit of every corpus is refused or changes nothing.
func TestEventLogEditsAreRefusedOrChangeNothing(t *testing.T) {
	total, bad := 0, 0
	// The corpora the policy refuses as they are; the others it admits.
	refused := map[string]bool{"stopped in the initrd": true, "init=/bin/sh passed": true}
	for _, c := range corpora(t) {
		orig := c.judge(t, c.logs)
		if (orig.reason != "") != refused[c.name] {
			t.Fatalf("%s: judged %q as it is", c.name, orig.reason)
		}
		// The corpus as the machine wrote it and as the edits re-encode it
		// are the same evidence.
		raw, err := bootlog.Verify(c.m.pcrs, c.fw, c.m.sd)
		again, err2 := bootlog.Verify(c.m.pcrs, c.logs.fwBytes(), c.logs.sdBytes())
		if err != nil || err2 != nil || !reflect.DeepEqual(raw, again) {
			t.Fatalf("%s: the re-encoded corpus verifies differently: %v, %v", c.name, err, err2)
		}
		for _, e := range c.edits() {
			total++
			if why := violation(orig, c.judge(t, e.logs)); why != "" {
				bad++
				if bad <= 20 {
					t.Errorf("%s, %s: %s", c.name, e.name, why)
				}
			}
		}
	}
	t.Logf("%d edits, %d violations", total, bad)
	if bad > 0 {
		t.Errorf("%d of %d edits violate the rule", bad, total)
	}
}

// FuzzEventLogEdits applies a fuzzed sequence of replay-preserving edits
// (the kinds TestEventLogEditsAreRefusedOrChangeNothing enumerates, with
// fuzzed contents, labels and positions) to a corpus and checks the same
// rule. The unit tier runs it for 30 s:
//
//	go test ./attest/tpm/ -run '^$' -fuzz FuzzEventLogEdits -fuzztime 30s
func FuzzEventLogEdits(f *testing.F) {
	cs := corpora(f)
	for i := range cs {
		f.Add(uint8(i), []byte{})
		f.Add(uint8(i), []byte{0, 3, 'x', 1, 5, 0x0d, 0, 0, 0})
		f.Add(uint8(i), []byte{2, 1, 3, 2, 4, 0, 5, 1, 'a', 6, 0, 'b'})
	}
	origs := map[uint8]outcome{}
	f.Fuzz(func(t *testing.T, which uint8, ops []byte) {
		c := cs[int(which)%len(cs)]
		key := uint8(int(which) % len(cs))
		orig, ok := origs[key]
		if !ok {
			orig = c.judge(t, c.logs)
			origs[key] = orig
		}
		l := applyOps(c.logs.clone(), ops)
		if why := violation(orig, c.judge(t, l)); why != "" {
			t.Fatalf("%s, ops %x: %s", c.name, ops, why)
		}
	})
}

// applyOps reads ops as edit instructions: an opcode, an event index and
// an operand, each a byte (a data operand is the rest up to a 0xff).
func applyOps(l logs, ops []byte) logs {
	next := func() int {
		if len(ops) == 0 {
			return 0
		}
		b := int(ops[0])
		ops = ops[1:]
		return b
	}
	text := func() []byte {
		i := bytes.IndexByte(ops, 0xff)
		if i < 0 {
			i = len(ops)
		}
		d := bytes.Clone(ops[:i])
		ops = ops[min(i+1, len(ops)):]
		return d
	}
	for len(ops) > 0 && len(l.fw) > 0 {
		op, k := next()%8, next()
		i := k % len(l.fw)
		switch op {
		case 0: // rewrite a firmware event's data
			l.fw[i].data = text()
		case 1: // relabel a firmware event (never to or from no-action)
			if ty := relabels[next()%len(relabels)]; l.fw[i].typ != tpmtest.EvNoAction {
				l.fw[i].typ = ty
			}
		case 2: // swap neighbours of different PCRs
			if i+1 < len(l.fw) && l.fw[i].pcr != l.fw[i+1].pcr {
				l.fw[i], l.fw[i+1] = l.fw[i+1], l.fw[i]
			}
		case 3: // move the last firmware event of a PCR to systemd's log
			if p := l.fw[i].pcr; l.fw[i].typ != tpmtest.EvNoAction && !slices.ContainsFunc(l.fw[i+1:], func(e fwEvent) bool { return e.pcr == p && e.typ != tpmtest.EvNoAction }) {
				e := l.fw[i]
				l.fw = slices.Delete(l.fw, i, i+1)
				l.sd = slices.Insert(l.sd, 0, sdRecord{pcr: e.pcr, digest: e.digest, str: string(e.data), typ: "phase"})
			}
		case 4: // move the first systemd record of a PCR to the firmware log
			if len(l.sd) > 0 {
				j := k % len(l.sd)
				p := l.sd[j].pcr
				if !slices.ContainsFunc(l.sd[:j], func(r sdRecord) bool { return r.pcr == p }) {
					r := l.sd[j]
					l.sd = slices.Delete(l.sd, j, j+1)
					l.fw = append(l.fw, fwEvent{pcr: r.pcr, typ: 0x0d, data: []byte(r.str), digest: r.digest})
				}
			}
		case 5: // add a no-action event
			l.fw = slices.Insert(l.fw, i, fwEvent{pcr: next() % 24, typ: tpmtest.EvNoAction, data: text()})
		case 6: // rewrite a systemd record's string
			if len(l.sd) > 0 {
				l.sd[k%len(l.sd)].str = string(text())
			}
		case 7: // relabel a systemd record
			if len(l.sd) > 0 {
				l.sd[k%len(l.sd)].typ = string(text())
			}
		}
	}
	return l
}
