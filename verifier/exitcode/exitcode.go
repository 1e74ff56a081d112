// Package exitcode names the exit codes of latchkey-verifier. They are a
// contract with systemd and with scripts: latchkey-verifier.service
// decides from them whether a restart can help (RestartPreventExitStatus=),
// and a deployment pipeline running `latchkey-verifier policy check` or
// `secret id` tells a refusal from a misuse by the number alone. The
// codes follow the usual shell meaning, as the agent's 0 to 2 do
// (agent/exitcode); systemd reserves 200 and above for its own failures.
package exitcode

// The verifier's exit codes. Keep units/latchkey-verifier.service and
// docs/configuration.md in sync when adding one.
const (
	// OK: the command did what it was asked (serve: stopped on SIGTERM).
	OK = 0
	// Failed: the command ran and failed: serve stopped serving, a
	// Kubernetes or admin-socket call failed, `policy check` found the
	// policy unfit. systemd restarts serve after a pause.
	Failed = 1
	// BadConfig: the command line or the configuration is wrong (an
	// unknown command or flag, a missing argument, an invalid config, a
	// missing, short or group-readable master secret, an invalid policy,
	// a listen, metricsListen or adminSocket address that cannot be
	// bound).
	// Not restarted: only the operator can fix it.
	BadConfig = 2
	// InUse: `secret retire` refused: disk records still name the
	// generation, or record none (docs/operations.md); or `bindings
	// migrate` refused a record etcd holds for another machine. Never
	// returned by serve.
	InUse = 3
)

// Last is the highest code the verifier uses.
const Last = InUse

// names are the codes' short stable names.
var names = [...]string{OK: "ok", Failed: "failed", BadConfig: "bad-config", InUse: "in-use"}

// Name returns a short stable name for code, for log lines.
func Name(code int) string {
	if code < 0 || code >= len(names) {
		return "unknown"
	}
	return names[code]
}
