// Package storm is latchkey's whole-join boot storm against the real
// control plane. It holds no code outside its tests:
// BenchmarkStorm starts the real latchkey-verifier binary in Kubernetes
// mode (the narrow credential of verifier/deploy, its CSR approver and
// token reaper), then as many concurrent agents as asked join at once:
// SEV-SNP agents signed by go-sev-guest's test signer, each with its own
// chip ID, node name and disk UUID, and a few swtpm TPM agents. Each
// join is whole: the ticket over attested TLS, then what the kubelet does
// with its bootstrap token (the client CSR for system:node:<name> with
// client-go's certificate helpers, waited for until latchkey's approver
// and the controller-manager's signer issue it), then with that
// certificate the Node registered and its Ready heartbeat, so the reaper
// deletes the token. It reports joins/s, ticket and whole-join latency,
// the CPU time of the verifier and of each control-plane process, and
// the tokens alive at the end and how fast they fall to zero.
//
// It imports test-only packages (snptest, tpmtest, k8stest); no shipped
// binary may import it. scripts/bench-storm.sh builds and runs it.
package storm
