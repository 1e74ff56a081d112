#!/usr/bin/env bash
# The whole latchkey test suite, the README's second command:
#   1. static checks: gofmt, go vet, generated protobuf code up to date,
#      shipped binaries free of test-only packages;
#   2. go test ./... : unit tests and the swtpm / cryptsetup integration
#      tests (needs root for loop devices), plus a short fuzz run;
#   3. systemd units and the image kit (systemd-analyze, debootstrap root);
#   4. the real Kubernetes control plane tier (kube-apiserver, etcd,
#      kube-controller-manager, kubeadm built from k8s.io/kubernetes);
#   5. the QEMU guest boots: a measured guest (OVMF, UKI, dm-verity root,
#      swtpm TPM) and its dm-crypt state disk: reboot, real tampering,
#      upgrade, crash.
# Tiers 3-5 cache their builds under .cache/ (or $LATCHKEY_CACHE_DIR).
#
#   scripts/test.sh            everything
#   scripts/test.sh --quick    tiers 1 and 2 only
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
cd "$(repo_root)"
quick=false
[[ ${1:-} == --quick ]] && quick=true

need_go
need_packages swtpm:swtpm swtpm_setup:swtpm-tools tpm2_pcrextend:tpm2-tools cryptsetup:cryptsetup-bin \
  protoc:protobuf-compiler mkfs.xfs:xfsprogs pvcreate:lvm2 sgdisk:gdisk mkfs.ext4:e2fsprogs \
  blkid:util-linux python3:python3

declare -A took=()
tier() {
  local name=$1 start=$SECONDS
  shift
  printf '\n\033[1m== %s\033[0m\n' "$name"
  "$@"
  took[$name]=$((SECONDS - start))
}

static_checks() {
  local unformatted
  unformatted=$(gofmt -l $(git ls-files '*.go' | grep -v '^proto/') 2>/dev/null || true)
  if [[ -n $unformatted ]]; then
    echo "gofmt: these files need formatting:" >&2
    echo "$unformatted" >&2
    return 1
  fi
  go vet ./...
  scripts/gen-proto.sh --check
  local bad
  bad=$(go list -deps ./agent/cmd/latchkey-agent ./verifier/cmd/latchkey-verifier |
    grep -E '^testing$|go-sev-guest/testing|tpmtest|snptest|attesttest' || true)
  if [[ -n $bad ]]; then
    echo "shipped binaries link test-only packages: $bad" >&2
    return 1
  fi
  echo "static checks passed"
}

unit_and_integration() {
  go test -count=1 -timeout 20m ./...
  # A short run of each fuzz target keeps the decoders honest.
  go test -run '^$' -fuzz '^FuzzDecodeEvidence$' -fuzztime 20s -fuzzminimizetime 2s ./attest/snp
}

tier "static checks" static_checks
tier "go test ./... (unit, swtpm, cryptsetup)" unit_and_integration
if ! $quick; then
  tier "systemd units and image kit" scripts/check-units.sh
  tier "kubernetes control plane" scripts/test-k8s.sh
  tier "qemu guest boots (kubeadm join --dry-run in the guest)" env LATCHKEY_E2E_JOIN=kubeadm scripts/e2e-vm.sh --phase2
fi

printf '\n\033[1m== summary\033[0m\n'
for k in "${!took[@]}"; do printf '   %-45s %5ss\n' "$k" "${took[$k]}"; done
echo "all tiers passed"
