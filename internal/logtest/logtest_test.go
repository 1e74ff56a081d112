package logtest_test

import (
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/latchkey/latchkey/internal/logtest"
)

// Loggers on several goroutines and a reader share one Buffer; every
// line arrives whole (go test -race checks the locking).
func TestBufferTakesConcurrentLines(t *testing.T) {
	b := &logtest.Buffer{}
	log := slog.New(slog.NewTextHandler(b, nil))
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 50 {
				log.Info("line", "writer", i)
				_ = b.String()
			}
		})
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 400 {
		t.Fatalf("%d lines, want 400", len(lines))
	}
	for _, l := range lines {
		if !strings.Contains(l, `msg=line writer=`) {
			t.Fatalf("torn line %q", l)
		}
	}
}
