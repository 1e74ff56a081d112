package app

import (
	"time"

	"github.com/latchkey/latchkey/agent/boot"
	"github.com/latchkey/latchkey/agent/config"
	"github.com/latchkey/latchkey/agent/cordon"
	"github.com/latchkey/latchkey/agent/disk"
	"github.com/latchkey/latchkey/agent/reattest"
	"github.com/latchkey/latchkey/agent/ticket"
	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/atls"
)

// Agent is the assembled agent: the boot, and the re-attestation loop it
// runs afterwards on the same evidence device.
type Agent struct {
	Boot *boot.Boot
	// Close releases the evidence device.
	Close  func()
	cfg    *config.Config
	deps   Deps
	issuer attest.Issuer
	// cordon is the offline cordon of this boot (nil: none).
	cordon *cordon.Cordoner
}

// Reattest builds the loop that re-attests the booted node (plan is what
// the disk stage found: its UUID is the node's disk); nil when
// reattest.disabled is set.
func (a *Agent) Reattest(plan disk.Plan, onRound func(int, reattest.Result, error)) (*reattest.Loop, error) {
	// After an offline boot the node re-attests even with re-attestation
	// off, until one round attests it (the verifier then clears the
	// offline taint and renews the grant).
	offlineOnly := a.cfg.Reattest.Disabled && a.Boot.BootedOffline()
	if a.cfg.Reattest.Disabled && !offlineOnly {
		return nil, nil
	}
	pins, err := atls.ParsePins(a.cfg.VerifierPins)
	if err != nil {
		return nil, err
	}
	interval := a.cfg.Reattest.Interval.Duration
	round := min(interval/2, reattestRoundMax)
	// Its own ticket client: one round is bounded by the round timeout,
	// and a policy refusal is not retried within the round (the verifier
	// has recorded it; asking again would only record it again).
	tickets, err := ticket.New(ticket.Config{Endpoints: a.cfg.Verifiers, Pins: pins,
		InsecureSkipVerifierAuth: a.cfg.InsecureSkipVerifierAuth, ServerName: a.cfg.VerifierName,
		Issuer: a.issuer, Timeout: round, RefusalBackoff: 2 * round, Logger: a.deps.Logger})
	if err != nil {
		return nil, err
	}
	cordoner, err := a.cordoner()
	if err != nil {
		return nil, err
	}
	return reattest.New(reattest.Config{NodeName: a.cfg.NodeName, DiskUUID: plan.UUID, Role: role(a.cfg.Role),
		DiskKeyGeneration: plan.KeyGeneration,
		// The ticket client's own timeout ends a round first, so its
		// error keeps the refusal (a cut-short parent would hide it).
		Tickets: tickets, Interval: interval, RoundTimeout: round + roundGrace, Logger: a.deps.Logger, OnRound: onRound,
		Offline: a.Boot, StopWhenAttested: offlineOnly, Cordon: cordoner})
}

// cordoner cordons the Node after an offline boot in Kubernetes mode
// (join not disabled), with the kubelet's credentials; nil otherwise.
// Nothing waits for it but the first re-attestation: the boot and the
// kubelet have started already, and an API server that is down (a
// whole-cluster power loss) only delays the attempts.
func (a *Agent) cordoner() (reattest.Cordoner, error) {
	if a.cfg.Join.Disabled || !a.Boot.BootedOffline() {
		return nil, nil
	}
	c, err := cordon.New(cordon.Config{NodeName: a.cfg.NodeName, Kubeconfig: cordon.DefaultKubeconfig, Logger: a.deps.Logger})
	if err != nil {
		return nil, err
	}
	a.cordon = c
	return c, nil
}

// CordonedOffline reports whether the agent cordoned its Node after this
// boot's offline unlock.
func (a *Agent) CordonedOffline() bool { return a.cordon != nil && a.cordon.Cordoned() }

// roundGrace is how much longer a round may run than its ticket client.
const roundGrace = 5 * time.Second

// reattestRoundMax bounds one re-attestation round.
const reattestRoundMax = reattest.MaxRoundTimeout
