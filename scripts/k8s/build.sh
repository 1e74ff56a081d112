#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kubeadm and kubelet from
# k8s.io/kubernetes (the version this nested module pins) into
#   ${LATCHKEY_CACHE_DIR:-<repo>/.cache}/k8s/<version>/
# and does nothing when all four binaries are already there. The local test
# control plane (scripts/controlplane.sh) and the Kubernetes integration tests
# use them. A full build takes about 20 minutes on a 2-core machine.
#
# Usage: scripts/k8s/build.sh        (prints the binary directory on stdout)
set -euo pipefail
# shellcheck source=../lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
version="$(awk '$1 == "k8s.io/kubernetes" { print $2 }' "$here/go.mod" | head -n1)"
if [[ -z "$version" ]]; then
	version="$(awk '/^require k8s.io\/kubernetes/ { print $3 }' "$here/go.mod")"
fi
[[ -n "$version" ]] || die "cannot read the k8s.io/kubernetes version from $here/go.mod"
out="${LATCHKEY_CACHE_DIR:-$repo/.cache}/k8s/$version"
cmds=(kube-apiserver kube-controller-manager kubeadm kubelet)

have_all() {
	local c
	for c in "${cmds[@]}"; do
		[[ -x "$out/$c" ]] || return 1
	done
}

if have_all; then
	echo "$out"
	exit 0
fi

# The version variables kubeadm and the servers report; kubeadm refuses to
# work with a binary whose version does not parse.
major="${version#v}"; major="${major%%.*}"
minor="${version#v*.}"; minor="${minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X '$pkg.gitVersion=$version'"
	ldflags+=" -X '$pkg.gitMajor=$major'"
	ldflags+=" -X '$pkg.gitMinor=$minor'"
	ldflags+=" -X '$pkg.gitTreeState=clean'"
	ldflags+=" -X '$pkg.buildDate=1970-01-01T00:00:00Z'"
done

mkdir -p "$out"
tmp="$(mktemp -d "$out/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
cd "$here"
for c in "${cmds[@]}"; do
	[[ -x "$out/$c" ]] && continue
	echo "build.sh: building $c $version" >&2
	start=$SECONDS
	CGO_ENABLED=0 nice -n "${LATCHKEY_BUILD_NICE:-10}" \
		go build -buildvcs=false -trimpath -ldflags="$ldflags" -o "$tmp/$c" "k8s.io/kubernetes/cmd/$c"
	mv "$tmp/$c" "$out/$c"
	echo "build.sh: built $c in $((SECONDS - start))s" >&2
done
echo "$out"
