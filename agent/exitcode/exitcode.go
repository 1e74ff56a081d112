// Package exitcode names the exit codes of latchkey-agent. They are a
// contract with systemd and with operators: latchkey-agent.service decides
// from them whether a restart can help (RestartPreventExitStatus=), and a
// human reading `systemctl status` learns from the number alone which stage
// gave up. Codes 1 and 2 follow the usual shell meaning; 3 to 6 are the
// agent's own. systemd reserves 200 and above for its own failures.
package exitcode

// The agent's exit codes. Keep units/latchkey-agent.service and
// image/README.md in sync when adding one.
const (
	// OK: the node attested, its state disk is open and it joined (or
	// rejoined).
	OK = 0
	// Internal: an unexpected failure (a bug, a system call that should not
	// fail). systemd restarts the agent.
	Internal = 1
	// BadConfig: the configuration (file, flags, kernel command line) is
	// invalid or incomplete, e.g. no verifier pin. A restart cannot help.
	BadConfig = 2
	// RefusedByPolicy: the verifier refused the evidence (PCR_MISMATCH,
	// MEASUREMENT_NOT_ALLOWED, ...). Not restarted: retrying the same
	// evidence cannot succeed until an operator changes the policy.
	RefusedByPolicy = 3
	// VerifierUnreachable: no verifier answered before the configured
	// timeout. systemd restarts the agent after a pause.
	VerifierUnreachable = 4
	// DiskRefused: the state disk is not one the agent may use (it carries
	// data and no LUKS header, its header is not this node's or was
	// altered, or it is missing, read-only or too small for the file
	// system). This run wrote no LUKS2 header; an operator must look.
	DiskRefused = 5
	// KubeadmFailed: `kubeadm join` failed. systemd restarts the agent; the
	// disk stays open and the rejoin path skips what is already done.
	KubeadmFailed = 6
	// VerifierNotAuthenticated: the verifiers answered, but none showed a
	// certificate matching a configured pin, so no evidence was sent. Not
	// restarted: the pin (or the verifier's certificate) must be fixed.
	VerifierNotAuthenticated = 7
	// Stopped: the agent was told to stop (SIGTERM) before the boot
	// finished; nothing failed.
	Stopped = 8
	// DeviceFailed: the TPM or the SEV-SNP guest device is missing (a
	// driver loading late: /dev/tpmrm0 not there yet), not answering, or
	// failed (out of object memory, locked out). systemd restarts the
	// agent, which first flushes what an earlier run left on the TPM.
	DeviceFailed = 9
	// DiskOpenFailed: the agent wrote the LUKS2 header to a disk it had
	// proved blank, then opening the disk failed (the mapping, mkfs or a
	// mount). Unlike DiskRefused, the disk was changed: it now carries
	// this node's header (or an interrupted install of it), and the next
	// boot goes on from there. Not restarted: the cause (a kernel module,
	// a mkfs error) needs an operator.
	DiskOpenFailed = 10
	// ClockBehind: the verifier's certificate, accepted through a pinned
	// CA, is not yet valid by this machine's clock, so the clock is
	// behind (no time synchronisation yet, a dead RTC battery). No
	// evidence was sent. systemd restarts the agent after a pause, by
	// when the clock has usually been set.
	ClockBehind = 12
)

// Codes lists every code the agent uses.
var Codes = []int{OK, Internal, BadConfig, RefusedByPolicy, VerifierUnreachable, DiskRefused,
	KubeadmFailed, VerifierNotAuthenticated, Stopped, DeviceFailed, DiskOpenFailed, ClockBehind}

// Last is the highest code the agent uses.
const Last = ClockBehind

// Name returns a short stable name for code, for log lines and the
// `latchkey-agent status` output.
func Name(code int) string {
	switch code {
	case OK:
		return "ok"
	case Internal:
		return "internal"
	case BadConfig:
		return "bad-config"
	case RefusedByPolicy:
		return "refused-by-policy"
	case VerifierUnreachable:
		return "verifier-unreachable"
	case DiskRefused:
		return "disk-refused"
	case KubeadmFailed:
		return "kubeadm-failed"
	case VerifierNotAuthenticated:
		return "verifier-not-authenticated"
	case Stopped:
		return "stopped"
	case DeviceFailed:
		return "device-failed"
	case DiskOpenFailed:
		return "disk-open-failed"
	case ClockBehind:
		return "clock-behind"
	default:
		return "unknown"
	}
}
