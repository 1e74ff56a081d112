package snp

import "time"

// WithClock sets the clock certificates are checked against (default
// time.Now): the tests' way to check certificates at a fixed time.
func WithClock(now func() time.Time) ValidatorOption { return func(v *Validator) { v.now = now } }
