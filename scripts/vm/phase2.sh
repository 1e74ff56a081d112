# shellcheck shell=bash
# shellcheck disable=SC2034 # BOOT_* globals are read by boot() in run.sh
# Phase 2 of scripts/e2e-vm.sh (sourced): latchkey's own scenario (issues
# 7 and 11) on a measured guest.
#
# The guest is the debootstrap root with latchkey installed by the real
# image/install.sh (binaries, units, drop-ins, presets, config), plus
# test-only units from scripts/vm/guest/phase2: a kubelet stand-in (so the
# real kubelet drop-in decides whether it starts) and a check unit that
# reports the boot's outcome and the PCRs on the console. The real
# image/build-measured.sh turns it into a GPT disk (ESP with a UKI, root
# under dm-verity) that OVMF boots with swtpm as the TPM, and predicts its
# PCRs 4, 11 and 12: that prediction is the verifier's policy. The
# verifier runs on a host loopback port, which the guest reaches as
# 192.0.2.100:7443 (the address on the UKI's command line).

# LATCHKEY_E2E_JOIN:
#   disabled (default) join.disabled in the agent config; the verifier runs
#            in disk-only mode. Needs nothing but this repository.
#   kubeadm  scripts/controlplane.sh's real control plane (its binaries come
#            from scripts/k8s/build.sh: about 20 minutes when not cached);
#            the verifier mints real tokens there, and the guest's agent
#            runs the real kubeadm `join --dry-run` (discovery: token, JWS,
#            CA pin) through guest/kubeadm's wrapper, which then leaves a
#            kubelet.conf so the reboot must skip the join.
P2_JOIN=${LATCHKEY_E2E_JOIN:-disabled}
P2_NETNS=latchkey-e2e-vm # the control plane's network namespace (kubeadm mode)
# The agent's ticket timeout in the guest: long enough for the verifier
# outage step, short enough that a refused boot ends within minutes.
P2_AGENT_TIMEOUT=${LATCHKEY_E2E_AGENT_TIMEOUT:-40s}
# The verifier as the measured command line names it, and its pin: the
# serving key lives in the cache (a throwaway test key) so the pin, the
# command line and so the whole image stay cacheable across runs.
P2_GUEST_VERIFIER=$GUEST_HOST_IP:7443
# One more kernel argument in the "rebuilt UKI" and "firmware override"
# tamper steps: a root shell on tty9, what an attacker would want.
P2_EVIL_ARG=systemd.debug_shell=1
# The agent's log line (journald forwards it to the console) at which the
# crash step cuts the power.
P2_CRASH_LINE='state disk: LUKS2 header written'

# phase2_missing prints what phase 2 still lacks in the tree, if anything.
phase2_missing() {
  [[ -x $REPO/image/install.sh ]] || echo "image/install.sh"
  [[ -n $(ls "$REPO"/agent/cmd/latchkey-agent/*.go 2>/dev/null) ]] || echo "agent/cmd/latchkey-agent"
  [[ -n $(ls "$REPO"/verifier/cmd/latchkey-verifier/*.go 2>/dev/null) ]] || echo "verifier/cmd/latchkey-verifier"
}

# build_latchkey sets P2_BIN to a folder with latchkey-agent and
# latchkey-verifier, built static and reproducibly (no VCS stamp), so the
# image cache key changes only when the code does.
build_latchkey() {
  P2_BIN=$VM_CACHE/bin
  mkdir -p "$P2_BIN"
  (cd "$REPO" && CGO_ENABLED=0 go build -trimpath -buildvcs=false -o "$P2_BIN/" \
    ./agent/cmd/latchkey-agent ./verifier/cmd/latchkey-verifier) || die "go build of latchkey failed"
}

# write_agent_config: the agent.yaml the image bakes in. The verifier and
# its pin come from the kernel command line, as image/README.md describes.
write_agent_config() {
  P2_AGENT_CONFIG=$VM_CACHE/agent-e2e-$P2_JOIN.yaml
  {
    echo "# latchkey-agent config of the e2e guest (scripts/vm/phase2.sh)"
    echo "variant: tpm"
    echo "timeout: $P2_AGENT_TIMEOUT"
    printf 'reattest:\n  interval: 3s\n' # the scenario sees the agent keep attesting
    echo "disk:"
    echo "  device: /dev/disk/by-id/virtio-latchkey-state"
    case $P2_JOIN in
      disabled) printf 'join:\n  disabled: true\n' ;;
      kubeadm) printf 'join:\n  kubeadm: /usr/local/sbin/latchkey-e2e-kubeadm\n  kubeadmDryRun: true\n  ignorePreflightErrors: [all]\n  discoveryTimeout: 2m\n' ;;
      *) die "LATCHKEY_E2E_JOIN=$P2_JOIN: want disabled or kubeadm" ;;
    esac
  } >"$P2_AGENT_CONFIG.tmp"
  mv "$P2_AGENT_CONFIG.tmp" "$P2_AGENT_CONFIG"
}

phase2_hook() {
  local root=$1
  "$REPO/image/install.sh" --root "$root" --bin-dir "$P2_BIN" --agent-config "$P2_AGENT_CONFIG" \
    >"$VM_CACHE/install-e2e.log" 2>&1 || { cat "$VM_CACHE/install-e2e.log" >&2; die "image/install.sh failed"; }
  cp -a "$REPO/scripts/vm/guest/phase2/." "$root/"
  if [[ $P2_JOIN == kubeadm ]]; then
    install -m 0755 "$K8S_BIN/kubeadm" "$root/usr/local/bin/kubeadm"
    cp -a "$REPO/scripts/vm/guest/kubeadm/." "$root/"
  fi
  systemctl --root="$root" enable kubelet.service \
    latchkey-e2e-check.service >/dev/null 2>&1 || die "enable phase 2 guest units failed"
}

build_phase2_image() {
  local missing
  missing=$(phase2_missing)
  [[ -z $missing ]] || die "phase 2 needs: ${missing//$'\n'/, }"
  build_latchkey
  write_agent_config
  build_measured_base
  local kubeadm_id=none
  if [[ $P2_JOIN == kubeadm ]]; then
    K8S_BIN=$("$REPO/scripts/k8s/build.sh") || die "scripts/k8s/build.sh failed"
    kubeadm_id=$(sha256sum "$K8S_BIN/kubeadm")
  fi
  [[ -n ${VERIFIER_PIN:-} ]] || verifier_pin
  build_measured "phase2-$P2_JOIN" phase2_hook "$( (sha256sum "$P2_BIN/latchkey-agent" "$P2_AGENT_CONFIG"
    echo "$kubeadm_id"; tree_hash "$REPO/image" "$REPO/units") | key_of)" \
    "console=ttyS0,115200 panic=1 latchkey.verifier=$P2_GUEST_VERIFIER latchkey.pin=$VERIFIER_PIN"
  IMAGE=$MEASURED/v1/disk.img
}

# ---------------------------------------------------------------- verifier

# k8s_up (kubeadm mode): starts the control plane in its own namespace
# and forwards its API server into the guests; sets the LATCHKEY_K8S_*
# variables of its env file.
k8s_up() {
  local env
  CLEANUP_HOOKS+=(k8s_down)
  env=$(LATCHKEY_CP_DIR=$RUN_DIR/cp LATCHKEY_CP_NETNS=$P2_NETNS "$REPO/scripts/controlplane.sh" up) ||
    die "scripts/controlplane.sh up failed"
  # shellcheck disable=SC1090
  source "$env"
  forward_to "${LATCHKEY_K8S_ENDPOINT%:*}" "${LATCHKEY_K8S_ENDPOINT#*:}" \
    "${LATCHKEY_K8S_ENDPOINT%:*}" "${LATCHKEY_K8S_ENDPOINT#*:}" "$P2_NETNS"
}

k8s_down() {
  LATCHKEY_CP_DIR=$RUN_DIR/cp LATCHKEY_CP_NETNS=$P2_NETNS "$REPO/scripts/controlplane.sh" down >/dev/null 2>&1
}

# verifier_init: config, master secret and serving key under
# $RUN_DIR/verifier; sets VERIFIER_PORT, VERIFIER_CONFIG, VERIFIER_PIN.
# In kubeadm mode the verifier runs in the control plane's namespace.
# verifier_pin: the pin of the e2e verifier's serving key, kept in the
# cache ($VM_CACHE/e2e-verifier-state, made on first use).
verifier_pin() {
  local state=$VM_CACHE/e2e-verifier-state
  mkdir -p "$state" && chmod 700 "$state"
  VERIFIER_PIN=$("$P2_BIN/latchkey-verifier" pin --state-dir "$state") || die "latchkey-verifier pin failed"
}

verifier_init() {
  local dir=$RUN_DIR/verifier
  mkdir -p "$dir" && chmod 700 "$dir"
  VERIFIER_PORT=$(free_port)
  head -c 32 /dev/urandom >"$dir/master.secret" && chmod 600 "$dir/master.secret"
  VERIFIER_CONFIG=$dir/verifier.yaml
  cat >"$VERIFIER_CONFIG" <<EOF
listen: 127.0.0.1:$VERIFIER_PORT
stateDir: $VM_CACHE/e2e-verifier-state
policy: $dir/policy.yaml
masterSecretFile: $dir/master.secret
clusterSalt: latchkey-e2e-vm
adminSocket: $dir/admin.sock
identity:
  bindingDir: $dir/bindings
EOF
  if [[ $P2_JOIN == kubeadm ]]; then
    printf 'kubernetes:\n  kubeconfig: %s\n' "$LATCHKEY_K8S_VERIFIER_KUBECONFIG" >>"$VERIFIER_CONFIG"
    VERIFIER_NS=$P2_NETNS
  fi
  [[ $("$P2_BIN/latchkey-verifier" pin --config "$VERIFIER_CONFIG") == "$VERIFIER_PIN" ]] ||
    die "the verifier's pin is not the one on the image's command line"
  VERIFIER_LOG=$dir/verifier.log
  : >"$VERIFIER_LOG"
  forward_to "${P2_GUEST_VERIFIER%:*}" "${P2_GUEST_VERIFIER#*:}" 127.0.0.1 "$VERIFIER_PORT" "$VERIFIER_NS"
}

VERIFIER_NS=''
verifier_start() {
  local pre=()
  [[ -n $VERIFIER_NS ]] && pre=(ip netns exec "$VERIFIER_NS")
  "${pre[@]}" "$P2_BIN/latchkey-verifier" serve --config "$VERIFIER_CONFIG" >>"$VERIFIER_LOG" 2>&1 &
  VERIFIER_PID=$!
  track "$VERIFIER_PID"
  wait_listen "$VERIFIER_PORT" 20 "$VERIFIER_NS" || die "verifier did not start (see $VERIFIER_LOG)"
}

verifier_stop() { stop_pid "$VERIFIER_PID"; }

# write_policy PCRS.YAML...: the verifier's policy, predicted from the
# images with no boot: `latchkey-verifier policy predict` on each image's
# UKI (next to its PCRS.YAML) gives the UKI's Authenticode digest (the
# component policy: PCR 4 through the replayed event log) and PCR 11 in
# the agent's boot phases; every listed image is admitted (an upgrade
# lists old and new together). The throwaway EK CA is the ekCARoots, so
# every node manufactured by it is trusted by its EK certificate. No
# golden boot is needed; the kit's own raw PCR 4/11/12 prediction is
# checked against what the guest quotes (check_quoted).
write_policy() {
  local policy=$RUN_DIR/verifier/policy.yaml pem f uki out ukis=() pcr11=()
  for f in "$@"; do
    uki=$(dirname "$f")/uki.efi
    out=$("$P2_BIN/latchkey-verifier" policy predict --uki "$uki" --secure-boot-off) ||
      die "policy predict failed for $uki"
    mapfile -t -O "${#ukis[@]}" ukis < <(sed -n 's/^    - \(sha256:[0-9a-f]\{64\}\)$/\1/p' <<<"$out")
    mapfile -t -O "${#pcr11[@]}" pcr11 < <(sed -n 's/^    - \([0-9a-f]\{64\}\)$/\1/p' <<<"$out")
  done
  ((${#ukis[@]} == $# && ${#pcr11[@]} > 0)) || die "policy predict printed no uki or pcr 11 value"
  {
    echo "# predicted by latchkey-verifier policy predict (scripts/vm/phase2.sh)"
    echo "apiVersion: latchkey/v1"
    echo "tpm:"
    echo "  boot:"
    echo "    secureBoot: {allowDisabled: true}"
    echo "    ukis: [$(IFS=,; echo "${ukis[*]}")]"
    echo "  pcrs:"
    echo "    \"11\": [$(IFS=,; echo "${pcr11[*]}")]"
    echo "  ekCARoots:"
    for pem in "$RUN_DIR/tpmca/issuercert.pem" "$RUN_DIR/tpmca/swtpm-localca-rootca-cert.pem"; do
      echo "  - |"
      sed 's/^/    /' "$pem"
    done
  } >"$policy.tmp"
  "$P2_BIN/latchkey-verifier" policy check "$policy.tmp" >&2 || die "predicted policy does not validate"
  mv "$policy.tmp" "$policy"
}

# predicted VARIANT PCR: the kit's prediction for one UKI.
predicted() { sed -n "s/^PCR$2=//p" "$MEASURED/$1/layout.env"; }
# quoted PCR: what the last boot's check unit read from the TPM.
quoted() { serial_value "pcr $1 sha256 " | tr 'A-F' 'a-f'; }

# audit_mark / audit_lines: the verifier's "join decision" lines logged
# since the mark, i.e. during one boot.
audit_mark() { AUDIT_FROM=$(wc -l <"$VERIFIER_LOG"); }
audit_lines() { tail -n "+$((AUDIT_FROM + 1))" "$VERIFIER_LOG" | grep 'msg="join decision"' || true; }
audit_has() { audit_lines | grep -E "$1" | grep -E "${2:-.}" >/dev/null; }
audit_count() { audit_lines | grep -cE "$1" || true; }

# ---------------------------------------------------------------- checks

agent_ready() { serial_has 'E2E: agent state=active result=success'; }
kubelet_started() { serial_has 'E2E: kubelet active' && serial_has 'E2E: kubelet stand-in started'; }
kubelet_not_started() { ! serial_has 'E2E: kubelet stand-in started' && ! serial_has 'E2E: kubelet active'; }
disk_open() { serial_has 'E2E: disk open cipher=aes-xts-plain64'; }
disk_closed() { serial_has 'E2E: disk closed'; }
binds_on_state() { serial_has 'E2E: bind /etc/kubernetes dm:latchkey-state\[/etc/kubernetes\]' &&
  serial_has 'E2E: bind /var/lib/kubelet dm:latchkey-state\[/var/lib/kubelet\]'; }
check_done() { serial_has "E2E: DONE boot $BOOT_LABEL"; }
disk_uuid() { serial_value 'disk uuid '; }
agent_ms() { serial_value 'agent ready in ' | awk '{print $1}'; }
host_luks_uuid() { cryptsetup luksUUID "$RUN_DIR/$1/state.img" 2>/dev/null || echo none; }
not_formatted() { ! serial_has 'LUKS2 header written'; }
agent_silent() { ! serial_has 'latchkey-agent\['; }
no_join_line() { ! serial_has 'running kubeadm join'; }
joined() { serial_has 'E2E: kubeadm join --dry-run succeeded'; }

# check_join WANT: the join assertions of one boot. WANT is "join" (the
# agent ran kubeadm with a freshly minted token) or "skip" (a rejoin that
# found kubelet credentials on the state disk: no token, no kubeadm).
check_join() {
  case $P2_JOIN:$1 in
    disabled:*) check "join skipped as configured" serial_has 'kubernetes join disabled; boot complete' ;;
    kubeadm:join)
      check "kubeadm join --dry-run ran" joined
      check "audit: a token was minted" audit_has 'result=accepted' 'token_id=' ;;
    kubeadm:skip)
      check "no second join" no_join_line
      check "agent found kubelet credentials" serial_has 'node holds kubelet credentials; skipping kubeadm join'
      check "audit: no token minted" test "$(audit_count 'token_id=')" -eq 0 ;;
  esac
}

# boot_note: the agent's share of the boot, for the results table: from
# its start to READY (state disk open), and to its exit (join done).
boot_note() {
  local ready finished
  ready=$(agent_ms)
  finished=$(serial_value 'agent finished in ' | awk '{print $1}')
  [[ -n $ready ]] && echo "agent: READY ${ready} ms, done ${finished:-?} ms"
}

# ---------------------------------------------------------------- scenario

run_phase2() {
  VM_FIRMWARE=uefi
  build_phase2_image
  if [[ $P2_JOIN == kubeadm ]]; then k8s_up; fi
  verifier_init
  node_create n1
  write_policy "$MEASURED/v1/pcrs.yaml"
  verifier_start
  p2_first_boot
  p2_reboot
  p2_tamper_root
  p2_tamper_cmdline
  p2_tamper_override
  p2_other_kernel
  p2_upgrade
  p2_verifier_down
  p2_crash
  verifier_stop
  if [[ $P2_JOIN == kubeadm ]]; then p2_no_secrets; fi
}

# node_esp NODE VARIANT: puts VARIANT's ESP (its UKI) on the node's disk,
# as a host (or an image upgrade) replacing \EFI\BOOT\BOOTX64.EFI would.
node_esp() {
  local off
  off=$(sed -n 's/^ESP_OFFSET=//p' "$MEASURED/v1/layout.env")
  dd if="$MEASURED/$2/esp.img" of="$RUN_DIR/$1/root.img" bs=1M seek=$((off / 1048576)) conv=notrunc status=none
}

# node_flip_agent_byte NODE: xors one byte of /usr/bin/latchkey-agent in
# the node's root partition (the data dm-verity checks); again restores it.
node_flip_agent_byte() {
  local off block b
  off=$(sed -n 's/^ROOT_OFFSET=//p' "$MEASURED/v1/layout.env")
  block=$(cat "$MEASURED/agent-block")
  off=$((off + block * 4096 + 64))
  b=$(dd if="$RUN_DIR/$1/root.img" bs=1 skip="$off" count=1 status=none | od -An -tu1 | tr -d ' ')
  printf '%b' "$(printf '\\0%03o' $((b ^ 0xff)))" |
    dd of="$RUN_DIR/$1/root.img" bs=1 seek="$off" count=1 conv=notrunc status=none
}

# policy_restart PCRS.YAML...: a new policy, and the verifier restarted on
# it (stateless: same master secret, same keys).
policy_restart() {
  write_policy "$@"
  verifier_stop
  verifier_start
}

# check_quoted VARIANT: the PCRs the guest read equal the kit's prediction.
check_quoted() {
  local idx
  for idx in 4 11 12; do
    check "pcr $idx quoted = predicted ($1)" test "$(quoted "$idx")" == "$(predicted "$1" "$idx")"
  done
}

# check_refused REASON DETAIL: the agent was refused by policy, nothing
# was opened, and the verifier's audit line names REASON with a message
# matching DETAIL (the component that changed).
check_refused() {
  check "guest powered off" booted_cleanly
  check "report complete" check_done
  check "agent refused (exit 3)" serial_has 'E2E: agent state=failed .*exit=3 '
  check "disk closed" disk_closed
  check "state not mounted" serial_has 'E2E: state mount none'
  check "kubelet not started" kubelet_not_started
  check "audit: refused $1 ($2)" audit_has 'result=refused' "reason=$1.*error=\"?.*$2"
  check "audit: nothing accepted" test "$(audit_count 'result=accepted')" -eq 0
}

# save_artifacts: the first measured boot's real artefacts, for reviewing
# (and for tests of) event-log policies: the firmware's TCG event log, the
# PCRs, the UKI and its command line ($RUN_DIR/artifacts; copied to
# LATCHKEY_E2E_ARTIFACTS when set).
# save_artifacts [SUBDIR VARIANT]: the same for another boot (into
# artifacts/SUBDIR, with VARIANT's UKI).
# save_b64 KEY FILE: the base64 value the guest printed after "E2E: KEY "
# into FILE. The artefacts are for review, not assertions: a line the
# kernel's own console output broke apart is reported and skipped.
save_b64() {
  local b64
  b64=$(serial_value "$1 ")
  [[ -n $b64 ]] || return 0
  if ! base64 -d <<<"$b64" >"$2" 2>/dev/null; then
    rm -f "$2"
    log "artefact $1 was garbled on the serial console; not saved"
  fi
}

save_artifacts() {
  local sub=${1:-} variant=${2:-v1} dir=$RUN_DIR/artifacts${1:+/$1}
  mkdir -p "$dir"
  save_b64 eventlog-b64 "$dir/binary_bios_measurements"
  save_b64 tpm2-measure-log-b64 "$dir/tpm2-measure.log"
  tr -d '\r' <"$BOOT_SERIAL" | grep -oE 'E2E: pcr [0-9]+ sha256 [0-9A-Fa-f]+' | sed 's/^E2E: pcr //' | tr 'A-F' 'a-f' >"$dir/pcrs-sha256.txt"
  cp "$MEASURED/$variant/uki.efi" "$dir/uki.efi"
  cp "$MEASURED/$variant/cmdline" "$dir/cmdline"
  printf '%s' "$(serial_value 'cmdline ')" >"$dir/proc-cmdline"
  cp "$MEASURED/$variant/pcrs.yaml" "$MEASURED/$variant/layout.env" "$dir/"
  save_b64 measure-b64 "$dir/latchkey-agent-measure.yaml"
  if [[ -n ${LATCHKEY_E2E_ARTIFACTS:-} ]]; then
    mkdir -p "$LATCHKEY_E2E_ARTIFACTS${sub:+/$sub}"
    cp -r "$dir/." "$LATCHKEY_E2E_ARTIFACTS${sub:+/$sub}/"
  fi
}

p2_first_boot() {
  audit_mark
  boot n1 first -- latchkey.e2e.golden
  N1_UUID=$(disk_uuid)
  save_artifacts
  check "guest powered off" booted_cleanly
  check "report complete" check_done
  check "root is dm-verity, read-only" serial_has 'E2E: root /dev/(mapper/root|dm-0) ro,.* verity=yes'
  check "event log printed" test -s "$RUN_DIR/artifacts/binary_bios_measurements"
  check_quoted v1
  check "agent ready" agent_ready
  check "disk formatted and open" disk_open
  check "disk uuid" test "${N1_UUID:-none}" != none
  check "state mounted" serial_has 'E2E: state mount dm:latchkey-state$'
  check "bind mounts" binds_on_state
  check "marker written" serial_has 'E2E: marker written by boot first'
  check "marker on state disk" serial_has 'E2E: marker is on the state disk'
  check "kubelet started" kubelet_started
  check "audit: accepted first join" audit_has 'result=accepted' "rejoin=false.*disk_uuid=$N1_UUID|disk_uuid=$N1_UUID.*rejoin=false"
  check "audit: exactly one join" test "$(audit_count 'purpose=join')" -eq 1
  check "agent re-attested twice after the boot" serial_has 'E2E: re-attested ([2-9]|[1-9][0-9])'
  check "audit: two re-attestations accepted" test "$(audit_count 'purpose=reattest .*result=accepted')" -ge 2
  check "host sees LUKS2 uuid" test "$(host_luks_uuid n1)" == "${N1_UUID:-x}"
  check_join join
  step_done "first boot v1: predicted policy, format" "$BOOT_SECS" "$(boot_note); join $P2_JOIN"
}

p2_reboot() {
  audit_mark
  boot n1 reboot
  check "guest powered off" booted_cleanly
  check "agent ready" agent_ready
  check "same disk" test "$(disk_uuid)" == "${N1_UUID:-x}"
  check "disk open" disk_open
  check "bind mounts" binds_on_state
  check "marker persisted" serial_has 'E2E: marker found, written by boot first'
  check "kubelet started" kubelet_started
  check "audit: rejoin accepted" audit_has 'result=accepted' 'rejoin=true'
  check "no second luksFormat" not_formatted
  check_join skip
  step_done "reboot: rejoin, same key, marker kept" "$BOOT_SECS" "$(boot_note)"
}

# p2_tamper_root: one byte of latchkey-agent changed on the root partition.
# dm-verity refuses the block when systemd executes the agent and, with
# panic-on-corruption, the kernel stops: nothing attests.
p2_tamper_root() {
  local uuid_before
  uuid_before=$(host_luks_uuid n1)
  node_flip_agent_byte n1
  audit_mark
  boot n1 tamper-root
  node_flip_agent_byte n1
  check "qemu ended (kernel panic, -no-reboot)" test "$BOOT_END" == poweroff
  check "dm-verity refused a block" serial_has 'device-mapper: verity: .*data block [0-9]+ is corrupted'
  check "kernel panicked on it" serial_has 'Kernel panic'
  check "no boot report" test -z "$(serial_value 'DONE boot ')"
  check "the agent never ran" agent_silent
  check "audit: no join at all" test "$(audit_count .)" -eq 0
  check "state disk untouched" test "$(host_luks_uuid n1)" == "$uuid_before"
  step_done "tampered root: dm-verity panic" "$BOOT_SECS" "1 byte of latchkey-agent; panic before attestation"
}

# p2_tamper_cmdline: a rebuilt UKI, v1's kernel and initrd with one more
# kernel argument; the firmware measures a new UKI (PCR 4), systemd-stub
# a new .cmdline (PCR 11).
p2_tamper_cmdline() {
  node_esp n1 evil-cmdline
  audit_mark
  boot n1 tamper-cmdline
  node_esp n1 v1
  check_refused COMPONENT_NOT_ALLOWED 'uki sha256:[0-9a-f]+ in pcr 4 is not allowed'
  check "guest runs the changed command line" serial_has "E2E: cmdline .*$P2_EVIL_ARG"
  check_quoted evil-cmdline
  check "pcr 11 differs from v1" test "$(quoted 11)" != "$(predicted v1 11)"
  step_done "tampered cmdline (rebuilt UKI): refused" "$BOOT_SECS" "COMPONENT_NOT_ALLOWED: the UKI"
}

# p2_tamper_override: v1's UKI as is, with a command line the firmware
# passes to it (QEMU -kernel/-append under OVMF: LoadOptions). systemd-stub
# 252 without Secure Boot takes it instead of .cmdline and measures it into
# PCR 12.
p2_tamper_override() {
  audit_mark
  BOOT_OVERRIDE_KERNEL=$MEASURED/v1/uki.efi BOOT_OVERRIDE_APPEND="$(cat "$MEASURED/v1/cmdline") $P2_EVIL_ARG"
  boot n1 tamper-override -- latchkey.e2e.golden
  BOOT_OVERRIDE_KERNEL='' BOOT_OVERRIDE_APPEND=''
  save_artifacts override v1
  # On QEMU's -kernel path OVMF logs the image before the "Calling EFI
  # Application" action, an order go-eventlog refuses to read as a boot:
  # refused before the command line is even looked at (a Boot#### entry's
  # optional data would be CMDLINE_NOT_ALLOWED; unit-tested in attest/tpm).
  check_refused EVENT_LOG_MISMATCH 'pcr 4: found EFIBootServicesApplication in PCR4 before CallingEFIApp event'
  check "guest runs the override" serial_has "E2E: cmdline .*$P2_EVIL_ARG"
  check "pcr 11 as predicted (same UKI sections)" test "$(quoted 11)" == "$(predicted v1 11)"
  check "pcr 12 holds the override" test "$(quoted 12)" != "$(predicted v1 12)"
  step_done "cmdline override by firmware: refused" "$BOOT_SECS" "EVENT_LOG_MISMATCH (image before CallingEFIApp); PCR 12 $(quoted 12 | cut -c1-12)…"
}

# p2_other_kernel: UKI v2 (another Debian kernel) before the policy lists it.
p2_other_kernel() {
  node_esp n1 v2
  audit_mark
  boot n1 other-kernel
  check_refused COMPONENT_NOT_ALLOWED 'uki sha256:[0-9a-f]+ in pcr 4 is not allowed'
  check_quoted v2
  check "pcr 11 differs from v1" test "$(quoted 11)" != "$(predicted v1 11)"
  step_done "UKI with another kernel: refused" "$BOOT_SECS" "COMPONENT_NOT_ALLOWED: kernel $KVER vs $KVER1"
}

# p2_upgrade: v2 listed next to v1; the same disk opens with the same key,
# and the marker of the first boot is there (no tampered boot touched it).
p2_upgrade() {
  policy_restart "$MEASURED/v1/pcrs.yaml" "$MEASURED/v2/pcrs.yaml"
  audit_mark
  boot n1 upgrade
  check "guest powered off" booted_cleanly
  check_quoted v2
  check "agent ready" agent_ready
  check "same disk" test "$(disk_uuid)" == "${N1_UUID:-x}"
  check "disk open" disk_open
  check "marker kept after the tampered boots" serial_has 'E2E: marker found, written by boot first'
  check "no second luksFormat" not_formatted
  check "audit: rejoin accepted" audit_has 'result=accepted' 'rejoin=true'
  check_join skip
  step_done "upgrade: v2 next to v1, same disk" "$BOOT_SECS" "$(boot_note)"
  node_esp n1 v1
}

# p2_no_secrets: no bootstrap token secret ("<id>.<secret>") was printed
# on any guest console (the agent streams kubeadm's output to the
# journal) or in the verifier's log.
p2_no_secrets() {
  local n
  n=$(cat "$RUN_DIR"/n*/serial-*.log "$VERIFIER_LOG" | tr -d '\r' |
    grep -cE '\b[a-z0-9]{6}\.[a-z0-9]{16}\b' || true)
  check "no bootstrap token in any log" test "$n" -eq 0
  step_done "no token secret in any log" - "$n match(es) in consoles + verifier log"
}

# p2_verifier_down: the verifier is stopped at boot and started again once
# the agent has logged a failed attempt.
p2_verifier_down() {
  verifier_stop
  audit_mark
  BOOT_TRIGGER_RE='join attempt failed'
  BOOT_TRIGGER_FN=verifier_start
  boot n1 verifier-down
  check "guest powered off" booted_cleanly
  check "agent saw the outage" serial_has 'join attempt failed'
  check "verifier restarted during boot" test "$BOOT_TRIGGERED" == 1
  check "agent ready" agent_ready
  check "same disk" test "$(disk_uuid)" == "${N1_UUID:-x}"
  check "marker kept after the tampered boots" serial_has 'E2E: marker found, written by boot first'
  check "no second luksFormat" not_formatted
  check "kubelet started" kubelet_started
  check "audit: rejoin accepted" audit_has 'result=accepted' 'rejoin=true'
  check_join skip
  step_done "verifier down at boot, back in time" "$BOOT_SECS" "$(boot_note)"
  if ! kill -0 "$VERIFIER_PID" 2>/dev/null; then verifier_start; fi
}

# p2_crash: a fresh node's QEMU is killed (a power cut, no shutdown) as
# soon as the agent logs that the LUKS2 header is on the disk; the agent is
# then mapping the volume or making the file system. The next boot must
# finish the job on the same header, without reformatting.
p2_crash() {
  local crash_uuid reached
  node_create n2
  # n2 is another machine (its own TPM) with n1's node name: the name is
  # bound to n1, so the operator releases it first, as for a replaced
  # machine. Without the release n2 is refused with IDENTITY_MISMATCH.
  check "operator releases n1's node name" "$P2_BIN/latchkey-verifier" bindings release \
    --node latchkey-e2e --socket "$RUN_DIR/verifier/admin.sock"
  check "release audited" grep -qE 'msg="binding released by admin".* kind=node name=latchkey-e2e ' "$VERIFIER_LOG"
  audit_mark
  boot n2 crash --kill-on "$P2_CRASH_LINE"
  crash_uuid=$(host_luks_uuid n2)
  reached=header-written
  serial_has 'state disk: file system made' && reached=filesystem-made
  serial_has 'E2E: DONE boot crash' && reached=end-of-boot
  check "qemu killed at the crash point" test "$BOOT_END" == killed
  check "killed before the boot completed" test "$reached" != end-of-boot
  check "header on disk" test "$crash_uuid" != none
  check "audit: first join accepted" audit_has 'result=accepted' 'rejoin=false'
  step_done "crash: power cut after LUKS header write" "$BOOT_SECS" "killed at: $reached"
  audit_mark
  boot n2 recover
  check "guest powered off" booted_cleanly
  check "agent ready" agent_ready
  check "not reformatted (same uuid)" test "$(disk_uuid)" == "$crash_uuid"
  check "no second luksFormat" not_formatted
  check "disk open" disk_open
  check "bind mounts" binds_on_state
  check "marker written" serial_has 'E2E: marker written by boot recover'
  check "audit: rejoin accepted" audit_has 'result=accepted' 'rejoin=true'
  check_join join
  step_done "crash recovery: finish without reformat" "$BOOT_SECS" "$(boot_note)"
}
