// Package load is latchkey's SNP load benchmark.
// It holds no code outside its tests: the test binary (go test -c) plays
// two roles, chosen by the LATCHKEY_LOAD_ROLE environment variable.
//
// As the load generator (BenchmarkSNPLoad) it makes a fake AMD chain with
// go-sev-guest's test signer (attest/snp/snptest), writes a verifier
// config, an SNP-only policy and a master secret, and starts itself again
// as the verifier: the real verifier/app assembly, serving attested TLS on
// 127.0.0.1 in its own process, with an in-memory token minter so every
// join mints a token and waits for the agent's ack. It then drives that
// process with many concurrent agents (agent/ticket), each join on its own
// TLS connection with a freshly signed report bound to its session, and
// reports the verifier's CPU time per verified join (from the process's
// own accounting, so the load generator sharing the machine does not
// count), compared with one bare ECDSA P-384 verification measured in the
// same run, plus joins/s, latency percentiles and the verifier's RSS.
//
// It imports go-sev-guest's testing package, so no shipped binary may
// import it. scripts/bench-load.sh builds and runs it.
package load
