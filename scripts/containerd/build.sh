#!/usr/bin/env bash
# Builds containerd and containerd-shim-runc-v2 from the containerd 2 Go
# module this nested module pins, into
#   ${LATCHKEY_CACHE_DIR:-<repo>/.cache}/containerd/<version>/
# with containerd's own systemd unit (containerd.service from the module),
# and does nothing when all three are already there. The measured QEMU
# guest runs them under the real kubelet (scripts/vm/build.sh): kubelet 1.36
# and later needs containerd 2, and Debian bookworm ships 1.6.
#
# Both are static (CGO_ENABLED=0), like containerd's own static release,
# with the build tags of its Makefile (urfave_cli_no_docs; the shim also
# no_grpc) plus no_btrfs, no_devmapper and no_zfs: the guest's state is
# ext4 on dm-crypt, so the overlayfs and native snapshotters are all it
# needs (btrfs needs cgo anyway; BUILDING.md lists the tags).
#
# Usage: scripts/containerd/build.sh   (prints the binary directory on stdout)
set -euo pipefail
# shellcheck source=../lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
pkg=github.com/containerd/containerd/v2
version="$(awk -v p="$pkg" '$1 == "require" && $2 == p { print $3 } $1 == p { print $2 }' "$here/go.mod" | head -n1)"
[[ -n "$version" ]] || die "cannot read the $pkg version from $here/go.mod"
out="${LATCHKEY_CACHE_DIR:-$repo/.cache}/containerd/$version"
cmds=(containerd containerd-shim-runc-v2)

have_all() {
	local c
	for c in "${cmds[@]}"; do
		[[ -x "$out/$c" ]] || return 1
	done
	[[ -f "$out/containerd.service" ]]
}

if have_all; then
	echo "$out"
	exit 0
fi

# What `containerd --version` reports; the revision is the module version,
# since a module build has no git checkout.
ldflags="-s -w -X '$pkg/version.Version=$version' -X '$pkg/version.Revision=$version' -X '$pkg/version.Package=$pkg'"
tags="urfave_cli_no_docs no_btrfs no_devmapper no_zfs"

mkdir -p "$out"
tmp="$(mktemp -d "$out/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
cd "$here"
for c in "${cmds[@]}"; do
	[[ -x "$out/$c" ]] && continue
	t="$tags"
	[[ "$c" == containerd-shim-runc-v2 ]] && t+=" no_grpc"
	echo "build.sh: building $c $version" >&2
	start=$SECONDS
	CGO_ENABLED=0 nice -n "${LATCHKEY_BUILD_NICE:-10}" \
		go build -buildvcs=false -trimpath -tags "$t" -ldflags="$ldflags" -o "$tmp/$c" "$pkg/cmd/$c"
	mv "$tmp/$c" "$out/$c"
	echo "build.sh: built $c in $((SECONDS - start))s" >&2
done
moddir="$(go list -m -f '{{.Dir}}' "$pkg")"
install -m 0644 "$moddir/containerd.service" "$tmp/containerd.service"
mv "$tmp/containerd.service" "$out/containerd.service"
echo "$out"
