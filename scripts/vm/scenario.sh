# shellcheck shell=bash
# shellcheck disable=SC2034 # BOOT_* globals are read by boot() in run.sh
# Scenarios of scripts/e2e-vm.sh (sourced): result bookkeeping, phase 1
# (the harness proof) and phase 2 (latchkey's first boot, rejoin, tamper,
# verifier outage and crash; scripts/vm/phase2.sh).

RESULTS=() # "step|PASS or FAIL|boot seconds|detail"
FAILED=0
STEP_FAILS=()

# check DESC CMD...: runs one assertion of the current step.
check() {
  local desc=$1
  shift
  if "$@"; then return 0; fi
  STEP_FAILS+=("$desc")
}

# step_done NAME SECS [NOTE]: records the current step's checks as a row.
step_done() {
  local name=$1 secs=$2 note=${3:-} detail
  if ((${#STEP_FAILS[@]})); then
    detail=$(IFS=';'; echo "failed: ${STEP_FAILS[*]}")
    RESULTS+=("$name|FAIL|$secs|$detail")
    FAILED=$((FAILED + 1))
    log "FAIL $name: $detail (serial: ${BOOT_SERIAL#"$REPO"/})"
  else
    RESULTS+=("$name|PASS|$secs|$note")
    log "PASS $name"
  fi
  STEP_FAILS=()
}

print_results() {
  local row name res secs detail passed=0 skipped=0
  printf '\n%-40s %-6s %8s  %s\n' STEP RESULT "BOOT s" DETAIL
  for row in "${RESULTS[@]}"; do
    IFS='|' read -r name res secs detail <<<"$row"
    printf '%-40s %-6s %8s  %s\n' "$name" "$res" "$secs" "$detail"
    case $res in
      PASS) passed=$((passed + 1)) ;;
      SKIP) skipped=$((skipped + 1)) ;;
    esac
  done
  printf '\ne2e-vm: %d passed, %d failed, %d skipped\n' "$passed" "$FAILED" "$skipped"
}

booted_cleanly() { [[ $BOOT_END == poweroff ]]; }

# serial_pcrs: the "pcr N sha256 HEX" lines of the last boot, sorted.
serial_pcrs() { tr -d '\r' <"$BOOT_SERIAL" | grep -oE 'E2E: pcr [0-9]+ sha256 [0-9A-Fa-f]+' | sort -u; }

# ---------------------------------------------------------------- phase 1

phase1_hook() {
  local root=$1
  cp -a "$REPO/scripts/vm/guest/phase1/." "$root/"
  systemctl --root="$root" enable latchkey-e2e-phase1.service >/dev/null 2>&1 ||
    die "enable latchkey-e2e-phase1.service failed"
}

build_phase1_image() { build_image phase1 phase1_hook; }

# start_key_service: a loopback TCP service that answers every connection
# with one line (a throwaway disk passphrase), standing in for the
# verifier in phase 1. Sets KEY_PORT.
start_key_service() {
  KEY_PORT=$(free_port)
  od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$RUN_DIR/phase1.key"
  echo >>"$RUN_DIR/phase1.key"
  socat "TCP-LISTEN:$KEY_PORT,bind=127.0.0.1,reuseaddr,fork" "OPEN:$RUN_DIR/phase1.key,rdonly" \
    2>"$RUN_DIR/phase1-keyservice.log" &
  track $!
  wait_listen "$KEY_PORT" 10 || die "phase 1 key service did not start"
  forward_port "$KEY_PORT"
}

run_phase1() {
  local golden pcrs
  build_phase1_image
  start_key_service
  BOOT_CMDLINE="latchkey.verifier=$GUEST_HOST_IP:$KEY_PORT"
  node_create p1

  boot p1 p1-first
  check "guest powered off" booted_cleanly
  check "tpm device" serial_has 'E2E: tpm: /dev/tpmrm0 present'
  check "guestfwd twice" serial_has 'E2E: net: host service .* answered twice'
  check "luksFormat" serial_has 'E2E: disk: formatted LUKS2'
  check "dm-crypt open" serial_has 'E2E: disk: opened with dm-crypt \(aes-xts-plain64\)'
  check "marker written" serial_has 'E2E: marker: written by boot p1-first'
  check "pass line" serial_has 'E2E: PASS boot p1-first'
  golden=$(serial_pcrs)
  check "pcrs printed" test "$(wc -l <<<"$golden")" -eq 10
  step_done "phase1: first boot (format, marker)" "$BOOT_SECS"

  boot p1 p1-reboot
  check "guest powered off" booted_cleanly
  check "header kept" serial_has 'E2E: disk: LUKS header present \(reboot\)'
  check "marker persisted" serial_has 'E2E: marker: found, written by boot p1-first'
  check "pass line" serial_has 'E2E: PASS boot p1-reboot'
  check "pcrs equal to first boot" test "$(serial_pcrs)" == "$golden"
  step_done "phase1: reboot (same TPM, marker kept)" "$BOOT_SECS"

  boot p1 p1-tamper -- latchkey.e2e.tamper=9
  pcrs=$(serial_pcrs)
  check "guest powered off" booted_cleanly
  check "tamper unit ran" serial_has 'E2E: tamper: recorded an event into pcr 9'
  check "pcr 9 changed" test "$(grep 'pcr 9 ' <<<"$pcrs")" != "$(grep 'pcr 9 ' <<<"$golden")"
  check "pcr 0-8 unchanged" test "$(grep -v 'pcr 9 ' <<<"$pcrs")" == "$(grep -v 'pcr 9 ' <<<"$golden")"
  check "marker persisted" serial_has 'E2E: marker: found, written by boot p1-first'
  step_done "phase1: tampered boot (pcr 9 differs)" "$BOOT_SECS"
}
