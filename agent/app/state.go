package app

import (
	"errors"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/latchkey/latchkey/agent/boot"
	"github.com/latchkey/latchkey/agent/disk"
	"github.com/latchkey/latchkey/agent/ticket"
	adminv1 "github.com/latchkey/latchkey/proto/latchkey/admin/v1"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// State is the agent's live boot state, served by `latchkey-agent
// status` over the local API. Safe for concurrent use.
type State struct {
	mu  sync.Mutex
	st  *adminv1.AgentStatus
	now func() time.Time
}

// NewState starts in STAGE_STARTING.
func NewState(node string, now func() time.Time) *State {
	if now == nil {
		now = time.Now
	}
	return &State{now: now, st: &adminv1.AgentStatus{
		Stage: adminv1.Stage_STAGE_STARTING, StageSinceUnix: now().Unix(), NodeName: node, StatusLine: "starting"}}
}

// Status returns a copy of the state (adminapi.State).
func (s *State) Status() *adminv1.AgentStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return proto.Clone(s.st).(*adminv1.AgentStatus)
}

var stageOf = map[boot.Progress]adminv1.Stage{
	boot.PreparingDisk: adminv1.Stage_STAGE_PREPARING_DISK,
	boot.Attesting:     adminv1.Stage_STAGE_ATTESTING,
	boot.OpeningDisk:   adminv1.Stage_STAGE_OPENING_DISK,
	boot.DiskOpen:      adminv1.Stage_STAGE_OPENING_DISK,
	boot.Joining:       adminv1.Stage_STAGE_JOINING,
	boot.Done:          adminv1.Stage_STAGE_READY,
}

// Progress records a boot progress report.
func (s *State) Progress(p boot.Progress, line string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := stageOf[p]; st != s.st.Stage {
		s.st.Stage, s.st.StageSinceUnix = st, s.now().Unix()
	}
	s.st.StatusLine = line
}

// Attempt records a verifier attempt.
func (s *State) Attempt(endpoint string, n int, line string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.VerifierEndpoint, s.st.Attempt, s.st.StatusLine = endpoint, uint32(n), line
}

// AttemptFailed records why an attempt failed (the boot goes on).
func (s *State) AttemptFailed(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.LastError = err.Error()
	var r *ticket.RefusedError
	if errors.As(err, &r) {
		s.st.LastReason = r.Reason
	}
}

// Failed records the end of a failed boot.
func (s *State) Failed(err error, code int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.Stage, s.st.StageSinceUnix = adminv1.Stage_STAGE_FAILED, s.now().Unix()
	s.st.LastError, s.st.ExitCode, s.st.StatusLine = err.Error(), int32(code), "failed: "+err.Error()
	var r *ticket.RefusedError
	if errors.As(err, &r) {
		s.st.LastReason = r.Reason
	}
}

// Plan records the state disk's UUID and whether this boot rejoins.
func (s *State) Plan(p disk.Plan) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.DiskUuid, s.st.Rejoin = p.UUID, p.Rejoin
}

// Variant records the evidence variant in use.
func (s *State) Variant(v latchkeyv1.Variant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.Variant = v
}

// Ticket records a ticket received: its verifier, evidence digest and, when
// it carried one, its token ID (a second attestation for a token keeps the
// first one's digest only if it brought none of its own).
func (s *State) Ticket(r ticket.Received) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.VerifierEndpoint, s.st.EvidenceDigest, s.st.Variant = r.Verifier, r.EvidenceDigest, r.Variant
	if r.TokenID != "" {
		s.st.TokenId = r.TokenID
	}
}

// Ready records the end of a successful boot.
func (s *State) Ready() { s.ReadyLine("node ready") }

// ReadyLine is Ready with its status line (an offline boot says how much
// of its grant is left).
func (s *State) ReadyLine(line string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st.Stage != adminv1.Stage_STAGE_READY {
		s.st.Stage, s.st.StageSinceUnix = adminv1.Stage_STAGE_READY, s.now().Unix()
	}
	s.st.ExitCode, s.st.StatusLine = 0, line
}
