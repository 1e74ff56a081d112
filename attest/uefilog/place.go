package uefilog

import (
	"slices"

	"github.com/latchkey/latchkey/attest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// Application is one EFI boot application the firmware measured, by its
// digest (the PE image's Authenticode hash under the register's hash).
type Application[D comparable] struct {
	Digest D
	// Attempt is the boot attempt that loaded it, from 1: one more than
	// the ReturningApp measurements before it (the firmware measures one
	// when a boot option's application returned and it tries the next).
	Attempt int
}

// Placement is what a component policy lists about boot applications,
// and how refusals name things.
type Placement[D comparable] struct {
	UKIs, Loaders []D
	// Signers is true when a UKI not in UKIs may still be admitted by a
	// later step (the TPM policy's pcr11Signers).
	Signers bool
	// Where names the register holding the applications ("pcr 4",
	// "rtmr 1"); Sections the one holding systemd-stub's sections.
	Where, Sections string
	// Name prints a digest.
	Name func(D) string
}

// Place judges the boot applications. The logs cannot say which
// application systemd-stub ran from (that is the order of events across
// registers, which nothing measures), so the policy places them: in the
// boot attempt that ran systemd-stub, boot loaders (Loaders), then the
// UKI, then what the UKI loaded itself (newer systemd-stub loads the
// embedded kernel with LoadImage; its bytes are covered by the UKI's
// digest). The UKI is the first application in UKIs; failing that, with
// Signers, the first one not in Loaders, which the caller judges. Every
// application of every other boot attempt, and every application when no
// systemd-stub ran (stubRan false), must be a boot loader. It returns
// the UKI and whether UKIs admitted it; every refusal is
// COMPONENT_NOT_ALLOWED.
func (p Placement[D]) Place(apps []Application[D], stubRan bool) (Application[D], bool, error) {
	var none Application[D]
	if !stubRan {
		if err := p.loaders(apps); err != nil {
			return none, false, err
		}
		if len(p.UKIs) > 0 || p.Signers {
			return none, false, attest.Refuse(latchkeyv1.Reason_COMPONENT_NOT_ALLOWED, "no uki in %s: %s holds no systemd-stub section measurements", p.Where, p.Sections)
		}
		return none, true, nil
	}
	u := slices.IndexFunc(apps, func(a Application[D]) bool { return slices.Contains(p.UKIs, a.Digest) })
	listed := u >= 0
	if !listed {
		u = slices.IndexFunc(apps, func(a Application[D]) bool { return !slices.Contains(p.Loaders, a.Digest) })
	}
	if u < 0 {
		return none, false, attest.Refuse(latchkeyv1.Reason_COMPONENT_NOT_ALLOWED, "no uki in %s: systemd-stub measured %s, every application is a boot loader", p.Where, p.Sections)
	}
	uki := apps[u]
	var others []Application[D]
	for i, a := range apps {
		if i < u || a.Attempt != uki.Attempt {
			others = append(others, a)
		}
	}
	if err := p.loaders(others); err != nil {
		return uki, false, err
	}
	if listed {
		return uki, true, nil
	}
	if !p.Signers {
		return uki, false, attest.Refuse(latchkeyv1.Reason_COMPONENT_NOT_ALLOWED, "uki %s in %s is not allowed", p.Name(uki.Digest), p.Where)
	}
	return uki, false, nil
}

func (p Placement[D]) loaders(apps []Application[D]) error {
	for _, a := range apps {
		if !slices.Contains(p.Loaders, a.Digest) {
			return attest.Refuse(latchkeyv1.Reason_COMPONENT_NOT_ALLOWED, "boot loader %s in %s is not allowed", p.Name(a.Digest), p.Where)
		}
	}
	return nil
}
