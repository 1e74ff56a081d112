#!/usr/bin/env bash
# Proof by real boot: a Debian guest under QEMU (TCG, no KVM) with swtpm as
# its TPM, a LUKS2 state disk opened with dm-crypt, and host services that
# the guest reaches only through QEMU's restricted user network.
#
#   scripts/e2e-vm.sh [--phase1 | --phase2 | --all] [--build-only] [--keep]
#
#   --phase1     the harness proof: TPM device, guestfwd, LUKS2 format/open,
#                a marker that survives a reboot, PCR stability and tamper
#   --phase2     the latchkey scenario: agent + verifier, first
#                boot, rejoin, tampered boot, verifier down, crash (default)
#   --all        phase 1, then phase 2
#   --build-only build (or reuse) the cached guest image and exit
#   --keep       keep the node disk images in the output folder
#
# Caches under ${LATCHKEY_CACHE_DIR:-<repo>/.cache}/vm; logs (serial
# consoles, swtpm, verifier) under ${LATCHKEY_E2E_OUT:-<repo>/out/e2e-vm}.
# Installs its host packages with apt-get when missing. Prints a table of
# steps and boot times; exits non-zero on any failure.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VM_CACHE=${LATCHKEY_CACHE_DIR:-$REPO/.cache}/vm
RUN_DIR=${LATCHKEY_E2E_OUT:-$REPO/out/e2e-vm}
MODE=phase2
BUILD_ONLY=0
KEEP=0
RUN_DIR_MADE=0

# shellcheck source=scripts/lib/common.sh
source "$REPO/scripts/lib/common.sh"
# shellcheck source=scripts/vm/build.sh
source "$REPO/scripts/vm/build.sh"
# shellcheck source=scripts/vm/run.sh
source "$REPO/scripts/vm/run.sh"
# shellcheck source=scripts/vm/scenario.sh
source "$REPO/scripts/vm/scenario.sh"
# shellcheck source=scripts/vm/phase2.sh
source "$REPO/scripts/vm/phase2.sh"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

parse_args() {
  while (($#)); do
    case $1 in
      --phase1) MODE=phase1 ;;
      --phase2) MODE=phase2 ;;
      --all) MODE=all ;;
      --build-only) BUILD_ONLY=1 ;;
      --keep) KEEP=1 ;;
      -h | --help) usage; exit 0 ;;
      *) usage >&2; exit 2 ;;
    esac
    shift
  done
}

on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  cleanup_processes
  # Only ever touch the output folder this run made, and only the files
  # it wrote there: throwaway secrets and, unless --keep, node disks.
  if ((RUN_DIR_MADE)); then
    rm -f "$RUN_DIR/verifier/master.secret" "$RUN_DIR/phase1.key"
    ((KEEP)) || rm -f "$RUN_DIR"/*/root.img "$RUN_DIR"/*/state.img
  fi
  exit "$rc"
}

# check_run_dir: the output folder is emptied at every run, so it must be
# one this script made (it carries a stamp file) or not exist yet, or be
# empty; anything else is refused rather than wiped.
RUN_STAMP=.latchkey-e2e-vm
check_run_dir() {
  RUN_DIR=$(realpath -m "$RUN_DIR")
  [[ $RUN_DIR != / ]] || die "refusing / as the output folder"
  if [[ -e $RUN_DIR && ! -f $RUN_DIR/$RUN_STAMP && -n $(ls -A "$RUN_DIR") ]]; then
    die "$RUN_DIR is not empty and was not made by e2e-vm.sh; refusing to wipe it (set LATCHKEY_E2E_OUT)"
  fi
}

main() {
  parse_args "$@"
  check_run_dir
  trap on_exit EXIT
  trap 'exit 130' INT TERM
  ensure_host_tools
  local t0=$SECONDS
  build_base
  log "base artefacts ready in $((SECONDS - t0)) s (cache: $VM_CACHE)"
  local phases=("$MODE") p
  [[ $MODE == all ]] && phases=(phase1 phase2)
  if ((BUILD_ONLY)); then
    for p in "${phases[@]}"; do "build_${p}_image"; done
    log "build done in $((SECONDS - t0)) s"
    return 0
  fi
  rm -rf --one-file-system "$RUN_DIR" && mkdir -p "$RUN_DIR"
  touch "$RUN_DIR/$RUN_STAMP"
  RUN_DIR_MADE=1
  for p in "${phases[@]}"; do "run_$p"; done
  print_results
  ((FAILED == 0))
}

main "$@"
