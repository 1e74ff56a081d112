package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/latchkey/latchkey/agent/app"
	bootpkg "github.com/latchkey/latchkey/agent/boot"
)

// After an offline unlock, `status` and `status --json` say so, with the
// boot number, the bound and the hours left, through the running agent's
// socket.
func TestStatusAfterOfflineUnlock(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "admin.sock")
	state := app.NewState("n1", nil)
	line := bootpkg.OfflineLine(bootpkg.OfflineStatus{Boot: 2, MaxBoots: 5, HoursLeft: 40.7})
	state.Progress(bootpkg.Done, line)
	state.ReadyLine("node ready; " + line)
	stop := serveStatus(socket, state, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer stop()

	const want = "node ready; unlocked offline (boot 2 of 5, 40 hours left)"
	var out bytes.Buffer
	if code := runStatus(socket, filepath.Join(dir, "last.json"), false, &out, io.Discard); code != 0 || !strings.Contains(out.String(), want) {
		t.Fatalf("status: exit %d\n%s\nwant %q", code, out.String(), want)
	}
	out.Reset()
	if code := runStatus(socket, filepath.Join(dir, "last.json"), true, &out, io.Discard); code != 0 {
		t.Fatalf("status --json: exit %d", code)
	}
	var rep map[string]any
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || rep["status"] != want || rep["ready"] != true {
		t.Fatalf("status --json: %v %v", err, rep)
	}
}
