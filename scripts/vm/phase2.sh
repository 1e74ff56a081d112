# shellcheck shell=bash
# Phase 2 of scripts/e2e-vm.sh (sourced): latchkey's own scenario.

# phase2_missing prints what phase 2 still lacks in the tree, if anything.
phase2_missing() {
  [[ -x $REPO/image/install.sh ]] || echo "image/install.sh"
  [[ -n $(ls "$REPO"/agent/cmd/latchkey-agent/*.go 2>/dev/null) ]] || echo "agent/cmd/latchkey-agent"
  [[ -n $(ls "$REPO"/verifier/cmd/latchkey-verifier/*.go 2>/dev/null) ]] || echo "verifier/cmd/latchkey-verifier"
}

build_phase2_image() {
  local missing
  missing=$(phase2_missing)
  [[ -z $missing ]] || die "phase 2 needs: ${missing//$'\n'/, }"
}

run_phase2() {
  build_phase2_image
}
