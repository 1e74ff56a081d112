package csr

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/internal/logtest"
)

// The line comes once every informer has listed, naming the component,
// and never while one has not.
func TestLogSynced(t *testing.T) {
	var logs logtest.Buffer
	log := componentLog(slog.New(slog.NewTextHandler(&logs, nil)), "csr-approver")
	yes := func() bool { return true }
	logSynced(context.Background(), log, yes, yes)
	if got := logs.String(); !strings.Contains(got, `msg="informers synced" component=csr-approver`) {
		t.Fatalf("synced: log %q", got)
	}

	var quiet logtest.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	logSynced(ctx, slog.New(slog.NewTextHandler(&quiet, nil)), yes, func() bool { return false })
	if quiet.String() != "" {
		t.Fatalf("one informer never synced, yet: %q", quiet.String())
	}
}
