package policy

import (
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/protocol"
)

// Deny is the policy's deny list: machines, node names and disks that are
// revoked even though their evidence is genuine (a node that was stolen,
// decommissioned or compromised while its TPM or chip still attests).
//
//	deny:
//	  nodeNames: ["worker-7"]
//	  diskUUIDs: ["<canonical lower-case uuid>"]
//	  ekPublicKeyHashes: ["sha256:<hex>"]   # as ekPublicKeyHashes / measure
//	  akPublicKeyHashes: ["sha256:<hex>"]
//	  snpChipIDs: ["<128 hex digits: the report's CHIP_ID>"]
//	  tdxPPIDs: ["<32 hex digits: the PCK certificate's PPID>"]
//	  machineIDs: ["tpm-ek:sha256:<hex>" | "tpm-ak:sha256:<hex>" | "snp-chip:<hex>[/host-data:<hex>]" | "tdx-ppid:<hex>[/mrconfigid:<hex>]"]
//
// machineIDs are the identities the verifier binds names to (the audit
// line's identity= and `latchkey-verifier bindings list`), so an operator
// can revoke exactly what a log line names.
//
// A nodeNames or diskUUIDs entry denies a machine, not only a name: the
// machine identity the binding store holds for that name is denied too
// (REVOKED "deny.nodeNames: worker-7, the machine bound to it"), so the
// machine cannot come back under a fresh node name or disk. The service
// looks the bound identity up at each join; `bindings release` of a
// denied name is refused, so the machine stays bound to it as long as the
// entry stands. In disk-only mode node names are never bound: there a
// nodeNames entry denies the name only, and the identity forms (or the
// disk's UUID) are what deny a machine. The list is reloaded with the
// policy; a join that matches any entry is refused as REVOKED right after
// its evidence is verified, before any binding is claimed, key derived or
// token minted.
type Deny struct {
	NodeNames         []string `json:"nodeNames,omitempty"`
	DiskUUIDs         []string `json:"diskUUIDs,omitempty"`
	EKPublicKeyHashes []string `json:"ekPublicKeyHashes,omitempty"`
	AKPublicKeyHashes []string `json:"akPublicKeyHashes,omitempty"`
	SNPChipIDs        []string `json:"snpChipIDs,omitempty"`
	TDXPPIDs          []string `json:"tdxPPIDs,omitempty"`
	MachineIDs        []string `json:"machineIDs,omitempty"`
}

// DenyList is a compiled Deny. The nil *DenyList denies nothing.
type DenyList struct {
	nodes, disks, ek, ak, chips, ppids, machines map[string]bool
}

// Deny-list keys, as the policy file and the audit line name them.
const (
	DenyNodeNames         = "deny.nodeNames"
	DenyDiskUUIDs         = "deny.diskUUIDs"
	DenyEKPublicKeyHashes = "deny.ekPublicKeyHashes"
	DenyAKPublicKeyHashes = "deny.akPublicKeyHashes"
	DenySNPChipIDs        = "deny.snpChipIDs"
	DenyTDXPPIDs          = "deny.tdxPPIDs"
	DenyMachineIDs        = "deny.machineIDs"
)

// compileDeny checks every entry, so a typo fails at load (and the policy
// in force stays) instead of silently revoking nothing:
//
//   - nodeNames: DNS-1123 subdomains (what the verifier accepts in a Hello);
//   - diskUUIDs: canonical lower-case UUIDs (the only form a disk has);
//   - ekPublicKeyHashes, akPublicKeyHashes: "sha256:<64 hex>";
//   - snpChipIDs: 64 bytes in hex (case-insensitive, normalized to lower);
//   - tdxPPIDs: 16 bytes in hex (case-insensitive, normalized to lower);
//   - machineIDs: "tpm-ek:sha256:<64 hex>", "tpm-ak:sha256:<64 hex>",
//     "snp-chip:<128 hex>" optionally followed by "/host-data:<64 hex>",
//     or "tdx-ppid:<32 hex>" optionally followed by "/mrconfigid:<96 hex>".
func compileDeny(d *Deny) (*DenyList, error) {
	if d == nil {
		return nil, nil
	}
	l := &DenyList{nodes: map[string]bool{}, disks: map[string]bool{}, ek: map[string]bool{},
		ak: map[string]bool{}, chips: map[string]bool{}, ppids: map[string]bool{}, machines: map[string]bool{}}
	for i, n := range d.NodeNames {
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			return nil, fmt.Errorf("%s[%d]: %q is not a DNS-1123 node name: %s", DenyNodeNames, i, n, strings.Join(errs, "; "))
		}
		l.nodes[n] = true
	}
	for i, u := range d.DiskUUIDs {
		if !protocol.ValidDiskUUID(u) {
			return nil, fmt.Errorf("%s[%d]: %q is not a canonical lower-case uuid", DenyDiskUUIDs, i, u)
		}
		l.disks[u] = true
	}
	for _, h := range []struct {
		key  string
		in   []string
		into map[string]bool
	}{{DenyEKPublicKeyHashes, d.EKPublicKeyHashes, l.ek}, {DenyAKPublicKeyHashes, d.AKPublicKeyHashes, l.ak}} {
		for i, s := range h.in {
			p, err := atls.ParsePin(s)
			if err != nil {
				return nil, fmt.Errorf("%s[%d]: %w", h.key, i, err)
			}
			h.into[p.String()] = true
		}
	}
	for i, c := range d.SNPChipIDs {
		raw, err := hex.DecodeString(c)
		if err != nil || len(raw) != 64 {
			return nil, fmt.Errorf("%s[%d]: %q is not a chip id (128 hex digits, the report's CHIP_ID)", DenySNPChipIDs, i, c)
		}
		l.chips[hex.EncodeToString(raw)] = true
	}
	for i, c := range d.TDXPPIDs {
		raw, err := hex.DecodeString(c)
		if err != nil || len(raw) != 16 {
			return nil, fmt.Errorf("%s[%d]: %q is not a PPID (32 hex digits, the PCK certificate's)", DenyTDXPPIDs, i, c)
		}
		l.ppids[hex.EncodeToString(raw)] = true
	}
	for i, m := range d.MachineIDs {
		if !validMachineID(m) {
			return nil, fmt.Errorf("%s[%d]: %q is not a machine identity (tpm-ek:sha256:<hex>, tpm-ak:sha256:<hex>, snp-chip:<hex>[/host-data:<hex>] or tdx-ppid:<hex>[/mrconfigid:<hex>], as the audit line's identity= shows it)", DenyMachineIDs, i, m)
		}
		l.machines[m] = true
	}
	return l, nil
}

func validMachineID(m string) bool {
	for _, pfx := range []string{"tpm-ek:", "tpm-ak:"} {
		if rest, ok := strings.CutPrefix(m, pfx); ok {
			p, err := atls.ParsePin(rest)
			return err == nil && p.String() == rest
		}
	}
	if rest, ok := strings.CutPrefix(m, "tdx-ppid:"); ok {
		ppid, cfg, hasCfg := strings.Cut(rest, "/mrconfigid:")
		return lowerHex(ppid, 16) && (!hasCfg || lowerHex(cfg, 48))
	}
	rest, ok := strings.CutPrefix(m, "snp-chip:")
	if !ok {
		return false
	}
	chip, host, hasHost := strings.Cut(rest, "/host-data:")
	if !lowerHex(chip, 64) {
		return false
	}
	return !hasHost || lowerHex(host, 32)
}

func lowerHex(s string, n int) bool {
	raw, err := hex.DecodeString(s)
	return err == nil && len(raw) == n && hex.EncodeToString(raw) == s
}

// Empty reports whether the list denies nothing.
func (l *DenyList) Empty() bool {
	return l == nil || len(l.nodes)+len(l.disks)+len(l.ek)+len(l.ak)+len(l.chips)+len(l.ppids)+len(l.machines) == 0
}

// Match returns the entry ("deny.nodeNames: worker-7") that a verified
// join for node and disk matches, or "" when it matches none. It checks
// the node name, the disk UUID, the machine identity, and the variant's
// own keys: the TPM's EK and AK hashes (an AK hash matches a machine
// identified by its EK too), the SNP chip ID.
func (l *DenyList) Match(node, disk string, v *attest.Verified) string {
	if l == nil {
		return ""
	}
	switch {
	case l.nodes[node]:
		return DenyNodeNames + ": " + node
	case l.disks[disk]:
		return DenyDiskUUIDs + ": " + disk
	case v == nil:
		return ""
	case v.MachineID != "" && l.machines[v.MachineID]:
		return DenyMachineIDs + ": " + v.MachineID
	}
	if v.State != nil {
		for _, k := range v.State.Keys() {
			if m := l.matchKey(k); m != "" {
				return m
			}
		}
	}
	return l.MatchIdentity(v.MachineID)
}

// matchKey returns the entry that denies a verified key, or "".
func (l *DenyList) matchKey(k attest.Key) string {
	switch k.Kind {
	case attest.KeyTPMEK:
		if l.ek[k.Value] {
			return DenyEKPublicKeyHashes + ": " + k.Value
		}
	case attest.KeyTPMAK:
		if l.ak[k.Value] {
			return DenyAKPublicKeyHashes + ": " + k.Value
		}
	case attest.KeySNPChip:
		if l.chips[k.Value] {
			return DenySNPChipIDs + ": " + k.Value
		}
	case attest.KeyTDXPPID:
		if l.ppids[k.Value] {
			return DenyTDXPPIDs + ": " + k.Value
		}
	}
	return ""
}

// MatchIdentity returns the entry that denies a machine identity as a
// binding record holds it, or "". It is what the revocation sweep uses to
// find the tokens of denied machines: machineIDs exactly, an EK hash as
// "tpm-ek:<hash>", an AK hash as "tpm-ak:<hash>" (a pinned AK; an AK of an
// EK-identified machine is not on record, so that machine's token is
// deleted when it next tries to join), a chip ID as "snp-chip:<hex>" with
// or without host data.
func (l *DenyList) MatchIdentity(id string) string {
	if l == nil || id == "" {
		return ""
	}
	if l.machines[id] {
		return DenyMachineIDs + ": " + id
	}
	if h, ok := strings.CutPrefix(id, "tpm-ek:"); ok && l.ek[h] {
		return DenyEKPublicKeyHashes + ": " + h
	}
	if h, ok := strings.CutPrefix(id, "tpm-ak:"); ok && l.ak[h] {
		return DenyAKPublicKeyHashes + ": " + h
	}
	if rest, ok := strings.CutPrefix(id, "snp-chip:"); ok {
		chip, _, _ := strings.Cut(rest, "/")
		if l.chips[chip] {
			return DenySNPChipIDs + ": " + chip
		}
	}
	if rest, ok := strings.CutPrefix(id, "tdx-ppid:"); ok {
		ppid, _, _ := strings.Cut(rest, "/")
		if l.ppids[ppid] {
			return DenyTDXPPIDs + ": " + ppid
		}
	}
	return ""
}

// NodeNames returns the denied node names, sorted.
func (l *DenyList) NodeNames() []string {
	if l == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(l.nodes))
}

// DiskUUIDs returns the denied disk UUIDs, sorted.
func (l *DenyList) DiskUUIDs() []string {
	if l == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(l.disks))
}

// BoundMachineEntry is the deny entry that denies a machine because a
// denied node name or disk UUID (entry, "deny.nodeNames: worker-7") is
// bound to it: "deny.nodeNames: worker-7, the machine bound to it".
func BoundMachineEntry(entry string) string { return entry + ", the machine bound to it" }

// DeniesNode reports whether node names a denied node.
func (l *DenyList) DeniesNode(node string) bool { return l != nil && l.nodes[node] }

// DeniesDisk reports whether uuid names a denied disk.
func (l *DenyList) DeniesDisk(uuid string) bool { return l != nil && l.disks[uuid] }
