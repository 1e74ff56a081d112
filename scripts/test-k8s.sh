#!/usr/bin/env bash
# Runs latchkey's Kubernetes integration tests (build tag k8s) against a
# real control plane: brings it up with scripts/controlplane.sh, runs the
# tests inside its network namespace, and brings it down again, whatever
# happened.
#
#   scripts/test-k8s.sh                 the tests
#   scripts/test-k8s.sh -bench .        ... and the benchmarks: extra
#                                       `go test` flags are passed through
#   LATCHKEY_K8S_KEEP=1 scripts/test-k8s.sh   leave the control plane up
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
pkgs=(./verifier/token/ ./verifier/csr/ ./agent/join/ ./verifier/app/ ./verifier/binding/ ./verifier/reattest/)

[[ $EUID -eq 0 ]] || die "run as root"
if [[ "${LATCHKEY_K8S_KEEP:-0}" != 1 ]]; then
	trap '"$here/controlplane.sh" down' EXIT
fi
envfile="$("$here/controlplane.sh" up)"
# shellcheck disable=SC1090
source "$envfile"

# Compile outside the namespace (it has no network for module downloads),
# run inside it (the API server is reachable only there).
bindir="$(mktemp -d)"
trap 'rm -rf "$bindir"; [[ "${LATCHKEY_K8S_KEEP:-0}" == 1 ]] || "$here/controlplane.sh" down' EXIT
cd "$repo"
for p in "${pkgs[@]}"; do
	name="$(echo "$p" | tr '/.' '__')"
	go test -c -tags k8s -o "$bindir/$name.test" "$p"
done
rc=0
for p in "${pkgs[@]}"; do
	name="$(echo "$p" | tr '/.' '__')"
	echo "== $p (k8s)"
	(cd "$p" && ip netns exec "$LATCHKEY_K8S_NETNS" env LATCHKEY_K8S_ENV="$envfile" \
		LATCHKEY_KUBEADM="$LATCHKEY_K8S_BIN/kubeadm" \
		"$bindir/$name.test" -test.count=1 -test.v -test.run "${LATCHKEY_K8S_RUN:-K8s}" "$@") || rc=$?
done
exit $rc
