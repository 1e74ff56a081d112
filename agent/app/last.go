package app

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/latchkey/latchkey/agent/exitcode"
	adminv1 "github.com/latchkey/latchkey/proto/latchkey/admin/v1"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// maxLastResultSize bounds what `latchkey-agent status` reads.
const maxLastResultSize = 64 << 10

// LastResult is the agent's last result, written when it exits so
// `latchkey-agent status` can answer after the process is gone. It holds
// what the journal's success or failure line holds, never a key, a token
// secret or anything else from the ticket.
type LastResult struct {
	// Result is "ready", "failed" or "stopped".
	Result string `json:"result"`
	// ExitCode is the process's exit code and Exit its name
	// (agent/exitcode).
	ExitCode int    `json:"exitCode"`
	Exit     string `json:"exit"`
	Node     string `json:"node,omitempty"`
	DiskUUID string `json:"diskUUID,omitempty"`
	Rejoin   bool   `json:"rejoin,omitempty"`
	Variant  string `json:"variant,omitempty"`
	// Verifier is the endpoint of the last attempt (host:port).
	Verifier string `json:"verifier,omitempty"`
	Attempts uint32 `json:"attempts,omitempty"`
	// EvidenceDigest and TokenID match the verifier's audit line.
	EvidenceDigest string `json:"evidenceDigest,omitempty"`
	TokenID        string `json:"tokenID,omitempty"`
	// Reason is the last refusal's reason, Error the last error.
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
	Status string `json:"status,omitempty"`
	// Finished is when the agent exited; PID which process it was.
	Finished time.Time `json:"finished"`
	PID      int       `json:"pid"`
}

// Result is the state as a LastResult for an agent exiting with code.
func (s *State) Result(code int) LastResult {
	st := s.Status()
	r := LastResult{Result: "failed", ExitCode: code, Exit: exitcode.Name(code), Node: st.GetNodeName(),
		DiskUUID: st.GetDiskUuid(), Rejoin: st.GetRejoin(), Verifier: st.GetVerifierEndpoint(),
		Attempts: st.GetAttempt(), EvidenceDigest: st.GetEvidenceDigest(), TokenID: st.GetTokenId(),
		Error: st.GetLastError(), Status: st.GetStatusLine(), Finished: s.now().UTC(), PID: os.Getpid()}
	switch code {
	case exitcode.OK:
		r.Result = "ready"
	case exitcode.Stopped:
		r.Result = "stopped"
	}
	if v := st.GetVariant(); v != latchkeyv1.Variant_VARIANT_UNSPECIFIED {
		r.Variant = strings.TrimPrefix(v.String(), "VARIANT_")
	}
	if rs := st.GetLastReason(); rs != latchkeyv1.Reason_REASON_UNSPECIFIED {
		r.Reason = rs.String()
	}
	return r
}

// WriteLastResult replaces the file at path with r atomically: a temporary
// file in the same directory, written, synced, made 0600 (as private as
// the status socket), renamed over path, and the directory synced. A
// reader sees the old result or the new one, never a torn file.
func WriteLastResult(path string, r LastResult) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("last result: %w", err)
	}
	f, err := os.CreateTemp(dir, ".last-*.tmp")
	if err != nil {
		return fmt.Errorf("last result: %w", err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp) // only the temporary file this call made
		}
	}()
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("last result: %w", err)
	}
	if _, err := f.Write(append(data, '\n')); err != nil {
		return fmt.Errorf("last result: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("last result: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("last result: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("last result: %w", err)
	}
	ok = true
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// ReadLastResult reads what WriteLastResult wrote, strictly (an unknown
// field or a file over 64 KiB is an error).
func ReadLastResult(path string) (*LastResult, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxLastResultSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxLastResultSize {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxLastResultSize)
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	var r LastResult
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if r.Result == "" {
		return nil, errors.New(path + ": no result")
	}
	return &r, nil
}

// AgentStatus renders r as the status `latchkey-agent status` prints for
// a running agent.
func (r *LastResult) AgentStatus() *adminv1.AgentStatus {
	st := &adminv1.AgentStatus{Stage: adminv1.Stage_STAGE_FAILED, StageSinceUnix: r.Finished.Unix(),
		Attempt: r.Attempts, VerifierEndpoint: r.Verifier, LastError: r.Error, NodeName: r.Node,
		DiskUuid: r.DiskUUID, Rejoin: r.Rejoin, ExitCode: int32(r.ExitCode), StatusLine: r.Status,
		EvidenceDigest: r.EvidenceDigest, TokenId: r.TokenID}
	if r.Result == "ready" {
		st.Stage = adminv1.Stage_STAGE_READY
	}
	st.LastReason = latchkeyv1.Reason(latchkeyv1.Reason_value[r.Reason])
	st.Variant = latchkeyv1.Variant(latchkeyv1.Variant_value["VARIANT_"+r.Variant])
	return st
}
