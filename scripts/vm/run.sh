# shellcheck shell=bash
# Boot harness for scripts/e2e-vm.sh (sourced, not executed): nodes (a root
# image copy, a blank state disk, a swtpm state with an EK certificate from
# a throwaway local CA), host services on loopback ports, QEMU boots under
# TCG with the serial console in a file, and cleanup of every process the
# harness started.
#
# Callers set RUN_DIR, KERNEL_DIR, INITRD and IMAGE (scripts/vm/build.sh).

VM_MEMORY=${LATCHKEY_VM_MEMORY:-1024}
VM_SMP=${LATCHKEY_VM_SMP:-2}
VM_BOOT_TIMEOUT=${LATCHKEY_VM_BOOT_TIMEOUT:-300}
VM_STATE_SIZE=256M
# direct: SeaBIOS with QEMU's -kernel/-initrd (phase 1); uefi: OVMF boots
# the measured disk's UKI (phase 2).
VM_FIRMWARE=direct
# QEMU's user network lives in TEST-NET-1 (never routed), so the guest can
# also reach scripts/controlplane.sh's API server at its own address
# (192.0.2.10) through a guestfwd rule; 192.0.2.100 carries host services.
VM_NET=192.0.2.0/24
GUEST_HOST_IP=192.0.2.100

BOOT_CMDLINE='' # kernel arguments added to every boot
BOOT_KILL_AFTER_TRIGGER=0
HARNESS_PIDS=()  # every long-running process we started, killed on exit
FORWARDS=()      # "GUEST_IP:PORT|COMMAND": guestfwd rules of every boot
CLEANUP_HOOKS=() # functions run at exit, after the processes are stopped

track() { HARNESS_PIDS+=("$1"); }

# stop_pid PID: terminates one process we started and reaps it.
stop_pid() {
  local pid=$1
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

cleanup_processes() {
  local pid hook
  for pid in "${HARNESS_PIDS[@]}"; do stop_pid "$pid"; done
  HARNESS_PIDS=()
  for hook in "${CLEANUP_HOOKS[@]}"; do "$hook" || true; done
  CLEANUP_HOOKS=()
}

now_ms() { date +%s%3N; }
secs_since() { awk -v a="$1" -v b="$(now_ms)" 'BEGIN { printf "%.1f", (b - a) / 1000 }'; }

# forward_port PORT [NETNS]: makes 127.0.0.1:PORT of the host (or of
# network namespace NETNS) reachable from every guest booted afterwards as
# 192.0.2.100:PORT. The cmd: form starts one socat per connection, so every
# connection works (the plain tcp: form serves only the first connection
# of a QEMU run).
forward_port() { forward_to "$GUEST_HOST_IP" "$1" 127.0.0.1 "$1" "${2:-}"; }

# forward_to GUEST_IP GUEST_PORT ADDR PORT [NETNS]: guest connections to
# GUEST_IP:GUEST_PORT go to ADDR:PORT, seen from NETNS when given.
forward_to() {
  local cmd="socat - TCP:$3:$4"
  [[ -n ${5:-} ]] && cmd="$(command -v ip) netns exec $5 $cmd"
  FORWARDS+=("$1:$2|$cmd")
}

# wait_listen PORT SECONDS [NETNS]: waits for a service on 127.0.0.1:PORT
# (in NETNS when given) to accept connections.
wait_listen() {
  local port=$1 deadline=$((SECONDS + $2)) pre=()
  [[ -n ${3:-} ]] && pre=(ip netns exec "$3")
  until "${pre[@]}" bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null; do
    ((SECONDS < deadline)) || return 1
    sleep 0.1
  done
}

# tpm_ca_init: a throwaway local CA for swtpm_setup, valid for this run.
# Sets TPM_SETUP_CONF; the CA's certificates are under $RUN_DIR/tpmca.
tpm_ca_init() {
  TPM_SETUP_CONF=$(swtpm_ca_config "$RUN_DIR/tpmca" "$RUN_DIR/tpmca" latchkey-e2e 2.1 QEMU)
}

# node_create NAME: a fresh node: root image copy, blank state disk, and a
# manufactured TPM (EK + EK certificate). Its folder is $RUN_DIR/NAME.
node_create() {
  local dir=$RUN_DIR/$1
  rm -rf "$dir" && mkdir -p "$dir/tpm"
  [[ -n ${TPM_SETUP_CONF:-} ]] || tpm_ca_init
  cp --sparse=always "$IMAGE" "$dir/root.img"
  [[ $VM_FIRMWARE == uefi ]] && cp "$OVMF_VARS" "$dir/ovmf-vars.fd"
  truncate -s "$VM_STATE_SIZE" "$dir/state.img"
  swtpm_setup --tpm2 --tpmstate "$dir/tpm" --create-ek-cert --create-platform-cert \
    --lock-nvram --config "$TPM_SETUP_CONF" --overwrite >"$dir/swtpm_setup.log" 2>&1 ||
    { cat "$dir/swtpm_setup.log" >&2; die "swtpm_setup for node $1 failed"; }
}

# start_swtpm NODE: starts the node's TPM; it exits when QEMU disconnects.
start_swtpm() {
  local dir=$RUN_DIR/$1
  rm -f "$dir/swtpm.sock"
  swtpm socket --tpm2 --tpmstate "dir=$dir/tpm" --terminate \
    --ctrl "type=unixio,path=$dir/swtpm.sock" \
    --log "file=$dir/swtpm.log,level=1" >>"$dir/swtpm.log" 2>&1 &
  SWTPM_PID=$!
  track "$SWTPM_PID"
  for _ in $(seq 100); do [[ -S $dir/swtpm.sock ]] && return 0; sleep 0.05; done
  die "swtpm for node $1 did not start (see $dir/swtpm.log)"
}

# qemu_args NODE CMDLINE: prints QEMU's arguments, one per line.
qemu_args() {
  local dir=$RUN_DIR/$1 cmdline=$2 f
  local net=user,id=n0,restrict=on,net=$VM_NET,host=${VM_NET%.*/*}.2,dns=${VM_NET%.*/*}.3
  for f in "${FORWARDS[@]}"; do
    net+=",guestfwd=tcp:${f%%|*}-cmd:${f#*|}"
  done
  printf '%s\n' -nodefaults -display none -no-reboot \
    -machine q35,accel=tcg -cpu max -smp "$VM_SMP" -m "$VM_MEMORY"
  if [[ $VM_FIRMWARE == uefi ]]; then
    # OVMF boots \EFI\BOOT\BOOTX64.EFI (the UKI) from the disk's ESP. The
    # command line is the UKI's own; the harness's per-boot knobs go
    # through fw_cfg, which nothing measures and only test units read.
    # BOOT_OVERRIDE_KERNEL/APPEND: QEMU's -kernel/-append under OVMF, i.e.
    # an image and a command line the host passes through the firmware.
    printf '%s\n' -drive "if=pflash,format=raw,unit=0,readonly=on,file=$OVMF_CODE" \
      -drive "if=pflash,format=raw,unit=1,file=$dir/ovmf-vars.fd" \
      -fw_cfg "name=opt/latchkey/e2e,string=${cmdline//,/,,}"
    if [[ -n ${BOOT_OVERRIDE_KERNEL:-} ]]; then
      printf '%s\n' -kernel "$BOOT_OVERRIDE_KERNEL" -append "$BOOT_OVERRIDE_APPEND"
    fi
  else
    printf '%s\n' -kernel "$KERNEL_DIR/vmlinuz" -initrd "$INITRD" -append "$cmdline"
  fi
  printf '%s\n' \
    -drive "file=$dir/root.img,if=none,id=root,format=raw,cache=unsafe" \
    -device virtio-blk-pci,drive=root \
    -drive "file=$dir/state.img,if=none,id=state,format=raw" \
    -device virtio-blk-pci,drive=state,serial=latchkey-state \
    -chardev "socket,id=chrtpm,path=$dir/swtpm.sock" \
    -tpmdev emulator,id=tpm0,chardev=chrtpm -device tpm-tis,tpmdev=tpm0 \
    -netdev "$net" -device virtio-net-pci,netdev=n0,romfile= \
    -serial "file:$dir/serial-$BOOT_LABEL.log"
}

# boot NODE LABEL [--kill-on REGEX] [--] [KERNEL ARGS...]: boots the node
# once and waits until the guest powers off, the timeout passes, or a
# serial line matches REGEX (then QEMU is killed: a crash). When
# BOOT_TRIGGER_RE is set, BOOT_TRIGGER_FN runs once as soon as a serial
# line matches it, and with BOOT_KILL_AFTER_TRIGGER=1 QEMU is killed right
# after it (all three are cleared afterwards). Sets BOOT_SERIAL,
# BOOT_SECS, BOOT_END (poweroff|killed|timeout), BOOT_STATUS (QEMU's exit
# status) and BOOT_TRIGGERED (1 when the trigger ran).
boot() {
  local node=$1 kill_on='' t0 qemu_pid args
  BOOT_LABEL=$2
  shift 2
  if [[ ${1:-} == --kill-on ]]; then kill_on=$2; shift 2; fi
  [[ ${1:-} == -- ]] && shift
  local cmdline="console=ttyS0,115200 root=/dev/vda rw panic=1 latchkey.e2e.boot=$BOOT_LABEL ${BOOT_CMDLINE:-} $*"
  [[ $VM_FIRMWARE == uefi ]] && cmdline="latchkey.e2e.boot=$BOOT_LABEL $*"
  BOOT_SERIAL=$RUN_DIR/$node/serial-$BOOT_LABEL.log
  : >"$BOOT_SERIAL"
  start_swtpm "$node"
  mapfile -t args < <(qemu_args "$node" "$cmdline")
  t0=$(now_ms)
  qemu-system-x86_64 "${args[@]}" >"$RUN_DIR/$node/qemu-$BOOT_LABEL.log" 2>&1 &
  qemu_pid=$!
  track "$qemu_pid"
  log "boot $node/$BOOT_LABEL started (serial: ${BOOT_SERIAL#"$REPO"/})"
  wait_boot "$qemu_pid" "$t0" "$kill_on"
  BOOT_SECS=$(secs_since "$t0")
  BOOT_TRIGGER_RE='' BOOT_TRIGGER_FN='' BOOT_KILL_AFTER_TRIGGER=0

  stop_pid "$SWTPM_PID"
  log "boot $node/$BOOT_LABEL: $BOOT_END after $BOOT_SECS s (qemu status $BOOT_STATUS)"
}

# wait_boot QEMU_PID T0 KILL_REGEX: the polling half of boot.
wait_boot() {
  local pid=$1 t0=$2 kill_on=$3 limit=$((VM_BOOT_TIMEOUT * 1000))
  BOOT_END=poweroff
  BOOT_TRIGGERED=0
  while kill -0 "$pid" 2>/dev/null; do
    if [[ -n ${BOOT_TRIGGER_RE:-} && $BOOT_TRIGGERED == 0 ]] && grep -qE "$BOOT_TRIGGER_RE" "$BOOT_SERIAL" 2>/dev/null; then
      BOOT_TRIGGERED=1
      log "serial matched '$BOOT_TRIGGER_RE': running $BOOT_TRIGGER_FN"
      "$BOOT_TRIGGER_FN"
      if ((BOOT_KILL_AFTER_TRIGGER)); then
        BOOT_END=killed
        kill -KILL "$pid" 2>/dev/null || true
        break
      fi
    fi
    if [[ -n $kill_on ]] && grep -qE "$kill_on" "$BOOT_SERIAL" 2>/dev/null; then
      BOOT_END=killed
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    if (($(now_ms) - t0 > limit)); then
      BOOT_END=timeout
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.2
  done
  BOOT_STATUS=0
  # (stderr: bash's own "Killed" job notice for the crash step)
  wait "$pid" 2>/dev/null || BOOT_STATUS=$?
}

# serial_has REGEX: true when the last boot's console printed a match.
serial_has() { tr -d '\r' <"$BOOT_SERIAL" | grep -E "$1" >/dev/null; }

# serial_value PREFIX: the rest of the last console line starting with
# "E2E: PREFIX" (carriage returns stripped).
serial_value() {
  tr -d '\r' <"$BOOT_SERIAL" | sed -n "s/^.*E2E: $1//p" | tail -n 1
}
