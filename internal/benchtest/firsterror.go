package benchtest

import "sync/atomic"

// FirstError keeps the first non-nil error that concurrent workers report.
// It exists because atomic.Value panics when two stores carry different
// concrete types ("compare and swap of inconsistently typed value"), and
// the errors a load generator sees do differ in type (a gRPC status, a
// context error, a dial error). The zero value is ready to use.
type FirstError struct{ p atomic.Pointer[error] }

// Set records err if it is the first non-nil error; later ones are dropped.
func (f *FirstError) Set(err error) {
	if err != nil {
		f.p.CompareAndSwap(nil, &err)
	}
}

// Err returns the first recorded error, or nil.
func (f *FirstError) Err() error {
	if e := f.p.Load(); e != nil {
		return *e
	}
	return nil
}
