// Package logtest captures what a program logs during a test: a Buffer
// safe for the goroutines of a server and the test that reads it.
//
// Test only: scripts/test.sh fails the build check when a shipped binary
// links it.
package logtest

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer whose writes and reads take one lock, so a
// test may read while the code under test still logs.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
