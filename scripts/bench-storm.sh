#!/usr/bin/env bash
# Whole-join boot storm: the real latchkey-verifier
# binary in Kubernetes mode against the real control plane
# (scripts/controlplane.sh), with many agents joining at once: SEV-SNP
# agents signed by go-sev-guest's test signer (each its own chip, node
# name and disk) and a few swtpm TPM agents. Each join is whole: the
# ticket, the kubelet's TLS bootstrap with its token (client CSR, waited
# for until latchkey's approver and the controller-manager's signer issue
# it), then the Node registered Ready with the issued certificate, so the
# verifier's reaper deletes the token. Prints joins/s, ticket and
# whole-join p50/p99, the CPU time of the verifier and of each
# control-plane process, and the tokens alive at the end and how fast
# they fall to zero. See scripts/bench/storm.
#
#   scripts/bench-storm.sh [-n SNP_AGENTS] [-t TPM_AGENTS] [-a MAX_IN_FLIGHT]
#                          [-q API_QPS] [-w REAP_WAIT] [-B]
#
#   -n  SEV-SNP agents                   (LATCHKEY_STORM_SNP, 500)
#   -t  swtpm TPM agents                 (LATCHKEY_STORM_TPM, 4)
#   -a  the verifier's limits.maxJoinsInFlight; 0 = its default
#                                        (LATCHKEY_STORM_MAX_IN_FLIGHT, 0)
#   -q  the verifier's kubernetes.apiQPS; 0 = its default
#                                        (LATCHKEY_STORM_API_QPS, 0)
#   -w  wait after the storm for the tokens to fall to zero
#                                        (LATCHKEY_STORM_REAP_WAIT, 2m)
#   -B  then the baseline on the same control plane: as many nodes join
#       with one kubeadm token made in advance, their CSRs approved by
#       kube-controller-manager's csrapproving controller, no verifier;
#       prints whole joins/s and CPU per join of both
#                                        (LATCHKEY_STORM_BASELINE=1)
#
# The control plane is this run's own unless LATCHKEY_K8S_ENV names a
# running one (LATCHKEY_CP_DIR, _NETNS, _ADDR choose where it lives, as
# for scripts/controlplane.sh; LATCHKEY_K8S_KEEP=1 leaves it up). A
# benchmark, not a test: scripts/test.sh does not run it. Run as root.
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$(repo_root)"
need_go
[[ $EUID -eq 0 ]] || die "run as root (network namespace, swtpm)"

snp=${LATCHKEY_STORM_SNP:-500}
tpm=${LATCHKEY_STORM_TPM:-4}
inflight=${LATCHKEY_STORM_MAX_IN_FLIGHT:-0}
qps=${LATCHKEY_STORM_API_QPS:-0}
reap=${LATCHKEY_STORM_REAP_WAIT:-2m}
baseline=${LATCHKEY_STORM_BASELINE:-0}
while getopts n:t:a:q:w:Bh opt; do
	case $opt in
	n) snp=$OPTARG ;;
	t) tpm=$OPTARG ;;
	a) inflight=$OPTARG ;;
	q) qps=$OPTARG ;;
	w) reap=$OPTARG ;;
	B) baseline=1 ;;
	*) sed -n '2,35p' "$0" >&2; exit 2 ;;
	esac
done

bindir="$(mktemp -d)"
envfile=${LATCHKEY_K8S_ENV:-}
cleanup() {
	rm -rf "$bindir"
	if [[ -z ${LATCHKEY_K8S_ENV:-} && ${LATCHKEY_K8S_KEEP:-0} != 1 ]]; then
		"$here/controlplane.sh" down
	fi
}
trap cleanup EXIT
# Compile outside the namespace (it has no network for module downloads).
go build -o "$bindir/latchkey-verifier" ./verifier/cmd/latchkey-verifier
go test -c -o "$bindir/storm.test" ./scripts/bench/storm
if [[ -z $envfile ]]; then
	envfile="$("$here/controlplane.sh" up)"
fi
# shellcheck disable=SC1090
source "$envfile"

args=(-test.run '^$' -test.bench '^BenchmarkStorm$' -test.benchtime 1x -test.timeout 20m
	-storm.verifier "$bindir/latchkey-verifier" -storm.snp "$snp" -storm.tpm "$tpm"
	-storm.max-in-flight "$inflight" -storm.kube-qps "$qps" -storm.reap-wait "$reap")
flagB=""
if [[ $baseline == 1 ]]; then
	args+=(-storm.baseline)
	flagB=" -B"
fi
echo "command: scripts/bench-storm.sh -n $snp -t $tpm -a $inflight -q $qps -w $reap$flagB"
ip netns exec "$LATCHKEY_K8S_NETNS" env LATCHKEY_STORM_BENCH=1 LATCHKEY_K8S_ENV="$envfile" \
	timeout --signal TERM --kill-after 30s 21m "$bindir/storm.test" "${args[@]}"
