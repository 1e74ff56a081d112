// Package policytest serves a fixed policy snapshot to unit tests of code
// that takes a policy.Source. It lives apart from policy so the shipped
// verifier never links it (scripts/test.sh checks): the verifier always
// serves a policy from a file, through policy.Store.
package policytest

import "github.com/latchkey/latchkey/verifier/policy"

// Static returns a policy.Source that always serves snap (no file, no
// reload).
func Static(snap *policy.Snapshot) policy.Source { return static{snap: snap} }

type static struct{ snap *policy.Snapshot }

func (s static) Current() *policy.Snapshot { return s.snap }
