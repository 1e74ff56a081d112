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
#            the verifier mints real tokens there and approves kubelet CSRs,
#            and the guest's agent runs the real `kubeadm join`: the real
#            kubelet (scripts/k8s/build.sh) on containerd 2
#            (scripts/containerd/build.sh) with Debian's runc and CNI
#            plugins does its TLS bootstrap, and the harness checks from
#            the host (scripts/vm/k8scheck, admin credential) that the Node
#            is Ready, its certificate names it, its token is gone, a
#            reboot reuses the credentials, and a hostile kubelet is denied.
#   kubeadm-dry-run  the same control plane, but `kubeadm join --dry-run`
#            (discovery only) through guest/kubeadm's wrapper, which then
#            leaves a stand-in kubelet.conf; no kubelet, no containerd.
P2_JOIN=${LATCHKEY_E2E_JOIN:-disabled}
# p2_k8s: a control plane runs (kubeadm or kubeadm-dry-run).
p2_k8s() { [[ $P2_JOIN == kubeadm || $P2_JOIN == kubeadm-dry-run ]]; }
# The CRI socket of the guest's containerd (agent: join.criSocket).
P2_CRI_SOCKET=unix:///run/containerd/containerd.sock
# kubeadm join preflight checks that cannot pass in this guest:
# SystemVerification reads the kernel's build configuration, which the
# guest does not carry (the kernel is unpacked from its package without
# /boot/config-*).
P2_IGNORE_PREFLIGHT=(SystemVerification)
# The guest-side names of the hostile step: n3 attests as P2_EVIL_NODE and
# its kubelet asks for P2_VICTIM_NODE's certificate.
P2_EVIL_NODE=latchkey-e2e-evil
P2_VICTIM_NODE=latchkey-e2e-victim
# The port the guest polls (latchkey.e2e.hold) until the harness has made
# its live assertions; it serves the content of $RUN_DIR/hold.
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
# Offline unlock: the bounds the policy grants from the verifier-outage
# step on (off before it), and how long a boot holding a grant tries the
# verifier before it unseals (the agent's offline.after).
P2_OFFLINE_MAX_BOOTS=2
P2_OFFLINE_MAX_HOURS=24
P2_OFFLINE_AFTER=5s
P2_OFFLINE_POLICY=0 # write_policy adds offlineUnlock when 1

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
  (cd "$REPO" && CGO_ENABLED=0 go build -trimpath -buildvcs=false -tags grpcnotrace -ldflags='-s -w' -o "$P2_BIN/" \
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
    printf 'offline:\n  after: %s\n' "$P2_OFFLINE_AFTER"
    echo "disk:"
    echo "  device: /dev/disk/by-id/virtio-latchkey-state"
    case $P2_JOIN in
      disabled) printf 'join:\n  disabled: true\n' ;;
      kubeadm-dry-run) printf 'join:\n  kubeadm: /usr/local/sbin/latchkey-e2e-kubeadm\n  kubeadmDryRun: true\n  ignorePreflightErrors: [all]\n  discoveryTimeout: 2m\n' ;;
      kubeadm) printf 'join:\n  kubeadm: /usr/local/bin/kubeadm\n  criSocket: %s\n  ignorePreflightErrors: [%s]\n  discoveryTimeout: 2m\n' \
        "$P2_CRI_SOCKET" "$(IFS=,; echo "${P2_IGNORE_PREFLIGHT[*]}")" ;;
      *) die "LATCHKEY_E2E_JOIN=$P2_JOIN: want disabled, kubeadm or kubeadm-dry-run" ;;
    esac
  } >"$P2_AGENT_CONFIG.tmp"
  mv "$P2_AGENT_CONFIG.tmp" "$P2_AGENT_CONFIG"
}

phase2_hook() {
  local root=$1
  "$REPO/image/install.sh" --root "$root" --bin-dir "$P2_BIN" --agent-config "$P2_AGENT_CONFIG" \
    >"$VM_CACHE/install-e2e.log" 2>&1 || { cat "$VM_CACHE/install-e2e.log" >&2; die "image/install.sh failed"; }
  cp -a "$REPO/scripts/vm/guest/phase2/." "$root/"
  if p2_k8s; then
    install -m 0755 "$K8S_BIN/kubeadm" "$root/usr/local/bin/kubeadm"
  fi
  case $P2_JOIN in
    kubeadm-dry-run) cp -a "$REPO/scripts/vm/guest/kubeadm/." "$root/" ;;
    kubeadm) phase2_kubelet_hook "$root" ;;
  esac
  systemctl --root="$root" enable kubelet.service \
    latchkey-e2e-check.service >/dev/null 2>&1 || die "enable phase 2 guest units failed"
}

# phase2_kubelet_hook ROOT: the real node: kubelet, containerd 2 and its
# runc shim (Debian's runc and CNI plugins come with the root file
# system), containerd's own unit, and guest/kubelet (kubelet's unit and
# kubeadm's drop-in, the containerd and CNI configuration, and the
# hostile step's knobs).
phase2_kubelet_hook() {
  local root=$1
  install -m 0755 "$K8S_BIN/kubelet" "$root/usr/local/bin/kubelet"
  install -m 0755 "$CONTAINERD_BIN/containerd" "$CONTAINERD_BIN/containerd-shim-runc-v2" "$root/usr/local/bin/"
  sed 's|^ExecStart=/usr/local/bin/containerd$|ExecStart=/usr/local/bin/containerd --config /etc/containerd/config.toml|' \
    "$CONTAINERD_BIN/containerd.service" >"$root/etc/systemd/system/containerd.service"
  grep -q -- '--config /etc/containerd/config.toml' "$root/etc/systemd/system/containerd.service" ||
    die "containerd.service: no ExecStart=/usr/local/bin/containerd line to point at the config"
  cp -a "$REPO/scripts/vm/guest/kubelet/." "$root/"
  systemctl --root="$root" enable containerd.service latchkey-e2e-hostname.service var-log.mount >/dev/null 2>&1 ||
    die "enable the kubelet guest's units failed"
}

build_phase2_image() {
  local missing
  missing=$(phase2_missing)
  [[ -z $missing ]] || die "phase 2 needs: ${missing//$'\n'/, }"
  build_latchkey
  write_agent_config
  build_measured_base
  local kubeadm_id=none
  if p2_k8s; then
    K8S_BIN=$("$REPO/scripts/k8s/build.sh") || die "scripts/k8s/build.sh failed"
    kubeadm_id=$(sha256sum "$K8S_BIN/kubeadm")
  fi
  if [[ $P2_JOIN == kubeadm ]]; then
    CONTAINERD_BIN=$("$REPO/scripts/containerd/build.sh") || die "scripts/containerd/build.sh failed"
    kubeadm_id+=$(sha256sum "$K8S_BIN/kubelet" "$CONTAINERD_BIN"/*)
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
  if p2_k8s; then
    printf 'kubernetes:\n  kubeconfig: %s\n' "$LATCHKEY_K8S_VERIFIER_KUBECONFIG" >>"$VERIFIER_CONFIG"
    printf 'metricsListen: 127.0.0.1:%s\n' "$P2_METRICS_PORT" >>"$VERIFIER_CONFIG"
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
    if ((P2_OFFLINE_POLICY)); then
      echo "  offlineUnlock: {maxBoots: $P2_OFFLINE_MAX_BOOTS, maxHours: $P2_OFFLINE_MAX_HOURS}"
    fi
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
# verifier_logged REGEX: a verifier log line since the mark matches.
verifier_logged() { tail -n "+$((AUDIT_FROM + 1))" "$VERIFIER_LOG" | grep -E "$1" >/dev/null; }

# ---------------------------------------------------------------- checks

agent_ready() { serial_has 'E2E: agent state=active result=success'; }
kubelet_started() {
  serial_has 'E2E: kubelet active' && { [[ $P2_JOIN == kubeadm ]] || serial_has 'E2E: kubelet stand-in started'; }
}
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
joined() {
  if [[ $P2_JOIN == kubeadm ]]; then
    serial_has 'msg="?kubeadm join succeeded"?' && ! serial_has 'kubeadm join.*--dry-run'
  else
    serial_has 'E2E: kubeadm join --dry-run succeeded'
  fi
}

not_joined() { ! serial_has 'msg="?kubeadm join succeeded"?'; }

# check_join WANT: the join assertions of one boot. WANT is "join" (the
# agent ran kubeadm with a freshly minted token) or "skip" (a rejoin that
# found kubelet credentials on the state disk: no token, no kubeadm).
check_join() {
  case $P2_JOIN:$1 in
    disabled:*) check "join skipped as configured" serial_has 'kubernetes join disabled; boot complete' ;;
    kubeadm-dry-run:join)
      check "kubeadm join --dry-run ran" joined
      check "audit: a token was minted" audit_has 'result=accepted' 'token_id=' ;;
    kubeadm:join)
      check "kubeadm join ran for real" joined
      check "audit: a token was minted" audit_has 'result=accepted' 'token_id=' ;;
    kubeadm*:skip)
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

# LATCHKEY_E2E_STEPS (for working on one step; default: all): the steps to
# run, by name (first_boot reboot tamper_root tamper_cmdline
# tamper_override other_kernel upgrade verifier_down offline crash
# hostile); later steps may rely on earlier ones (offline on
# verifier_down's grant).
P2_STEPS=${LATCHKEY_E2E_STEPS:-all}
p2_step() {
  [[ $P2_STEPS == all || " $P2_STEPS " == *" $1 "* ]] || return 0
  "p2_$1"
}

run_phase2() {
  VM_FIRMWARE=uefi
  # kubelet and containerd need a few hundred MiB more than the agent, and
  # a boot now includes a real join and the host's checks while it holds.
  if [[ $P2_JOIN == kubeadm ]]; then
    VM_MEMORY=${LATCHKEY_VM_MEMORY:-1536}
    VM_BOOT_TIMEOUT=${LATCHKEY_VM_BOOT_TIMEOUT:-600}
  fi
  build_phase2_image
  if p2_k8s; then k8s_up; fi
  [[ $P2_JOIN == kubeadm ]] && p2_live_init
  verifier_init
  node_create n1
  write_policy "$MEASURED/v1/pcrs.yaml"
  verifier_start
  p2_step first_boot
  p2_step reboot
  p2_step tamper_root
  p2_step tamper_cmdline
  p2_step tamper_override
  p2_step other_kernel
  p2_step upgrade
  p2_step verifier_down
  p2_step offline
  p2_step crash
  [[ $P2_JOIN == kubeadm ]] && p2_step hostile
  verifier_stop
  if p2_k8s; then p2_no_secrets; fi
}

# ---------------------------------------------------------------- live

# p2_live_init (kubeadm mode): the host's view of the cluster (k8scheck,
# with the admin credential) and the hold port: a guest booted with
# latchkey.e2e.hold waits, once kubelet has its certificate, until
# 192.0.2.100:7450 answers "done" (the content of $HOLD_FILE), so the
# harness checks the Node while its kubelet runs.
P2_METRICS_PORT=9464
p2_live_init() {
  (cd "$REPO" && CGO_ENABLED=0 go build -trimpath -o "$RUN_DIR/k8scheck" ./scripts/vm/k8scheck) ||
    die "go build of scripts/vm/k8scheck failed"
  HOLD_FILE=$RUN_DIR/hold
  : >"$HOLD_FILE"
  FORWARDS+=("$GUEST_HOST_IP:7450|$(command -v cat) $HOLD_FILE")
}

# kc ARGS...: k8scheck inside the control plane's namespace with the
# admin credential; its one line goes to the log and k8scheck.log.
kc() {
  ip netns exec "$P2_NETNS" "$RUN_DIR/k8scheck" -kubeconfig "$LATCHKEY_K8S_ADMIN_KUBECONFIG" "$@" 2>&1 |
    tee -a "$RUN_DIR/k8scheck.log" >&2
  return "${PIPESTATUS[0]}"
}

# p2_hold BOOT ARGS: what a live boot needs: the hold closed, the time
# the boot starts (a Ready heartbeat must be newer), and the trigger.
p2_hold() {
  : >"$HOLD_FILE"
  LIVE_SINCE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  BOOT_TRIGGER_RE='E2E: holding for the harness'
  BOOT_TRIGGER_FN=$1
}

# tokens_used: the verifier's count of tokens deleted after use.
tokens_used() {
  ip netns exec "$P2_NETNS" curl -sf "http://127.0.0.1:$P2_METRICS_PORT/metrics" |
    awk '$1 == "latchkey_verifier_tokens_revoked_total{cause=\"used\"}" {print $2}'
}

# p2_live NODE join|skip: the host's checks while the guest holds: the
# Node is Ready with a heartbeat from this boot, the kubelet's client
# certificate (the guest printed it, never its key) names the node and
# chains to the cluster CA; after a join also latchkey's CSR approval and
# the token's deletion by the reaper. Then the guest is released.
p2_live() {
  local node=$1 want=$2 id pem=$RUN_DIR/kubelet-client-$1-$BOOT_LABEL.pem
  check "host: node $node Ready, heartbeat from this boot" kc node-ready -node "$node" -since "$LIVE_SINCE" -timeout 300s
  save_b64 kubelet-client-cert-b64 "$pem"
  check "host: kubelet client cert is system:node:$node, O=system:nodes" kc client-cert -node "$node" -cert "$pem"
  if [[ $want == join ]]; then
    check "host: kubelet CSR approved by latchkey, its cert the kubelet's" kc csr-approved -node "$node" -since "$LIVE_SINCE" \
      -cert "$pem" -timeout 60s
    id=$(audit_lines | grep -oE 'token_id=[a-z0-9]{6}' | tail -n 1 | cut -d= -f2)
    check "host: token ${id:-?} deleted after use" kc token-gone -id "${id:-none}" -timeout 180s
    check "verifier: reaper deleted ${id:-?}" grep -qE "bootstrap token deleted after use.* token_id=${id:-none}" "$VERIFIER_LOG"
    # Exactly one: this verifier process (restarted by the upgrade and
    # outage steps) reaped this token and no other, once.
    check "metric tokens_revoked_total{cause=used} is 1" test "$(tokens_used)" == 1
  fi
  echo "done" >"$HOLD_FILE"
}
p2_live_first() { p2_live latchkey-e2e join; }
p2_live_reboot() { p2_live latchkey-e2e skip; }
p2_live_recover() { p2_live latchkey-e2e join; }

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

# p2_hold_arg: the knob that makes the guest hold for the live checks
# (real kubelet only).
p2_hold_arg() { [[ $P2_JOIN == kubeadm ]] && echo latchkey.e2e.hold; }
# check_live: the live checks ran (the guest reached the hold).
check_live() {
  [[ $P2_JOIN == kubeadm ]] || return 0
  check "host checks ran while kubelet ran" test "$BOOT_TRIGGERED" == 1
  check "guest released by the harness" serial_has 'E2E: released by the harness: done'
}

p2_first_boot() {
  audit_mark
  [[ $P2_JOIN == kubeadm ]] && p2_hold p2_live_first
  # shellcheck disable=SC2046 # no knob or one word
  boot n1 first -- latchkey.e2e.golden $(p2_hold_arg)
  N1_UUID=$(disk_uuid)
  save_artifacts
  check "guest powered off" booted_cleanly
  check "report complete" check_done
  check "root is dm-verity, read-only" serial_has 'E2E: root /dev/(mapper/root|dm-0) ro,.* verity=yes'
  # The guest read its event log and printed it. Whether the saved copy
  # decodes depends on the kernel not writing to the console mid-line
  # (save_b64: the artefacts are for review), so the check reads the line.
  check "event log printed" serial_has 'E2E: eventlog-b64 [A-Za-z0-9+/]{64}'
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
  check_live
  step_done "first boot v1: predicted policy, format" "$BOOT_SECS" "$(boot_note); join $P2_JOIN"
}

p2_reboot() {
  audit_mark
  [[ $P2_JOIN == kubeadm ]] && p2_hold p2_live_reboot
  # shellcheck disable=SC2046
  boot n1 reboot -- $(p2_hold_arg)
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
  check_live
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
  # On QEMU's -kernel path OVMF measures the UKI into PCR 4 before the
  # "Calling EFI Application" action (it loads the image, then signals
  # ReadyToBoot); the verifier reads PCR 4 by digest, so the UKI is v1's and
  # the kernel systemd-stub loads is its payload (one boot attempt: no
  # "Returning from EFI Application"). systemd-stub measures the load
  # options into PCR 12 as the UTF-16 bytes it logs, so the command line is
  # content-verified and the policy (no kernelCmdlines) refuses it by name.
  check_refused CMDLINE_NOT_ALLOWED "kernel command line .*$P2_EVIL_ARG.* in pcr 12 is not allowed"
  check "guest runs the override" serial_has "E2E: cmdline .*$P2_EVIL_ARG"
  check "pcr 11 as predicted (same UKI sections)" test "$(quoted 11)" == "$(predicted v1 11)"
  check "pcr 12 holds the override" test "$(quoted 12)" != "$(predicted v1 12)"
  step_done "cmdline override by firmware: refused" "$BOOT_SECS" "CMDLINE_NOT_ALLOWED ($P2_EVIL_ARG); PCR 12 $(quoted 12 | cut -c1-12)…"
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
# the agent has logged a failed attempt. It comes back with a policy that
# allows offline unlock (v1 and v2, offlineUnlock): the rejoin that ends
# this boot carries the first offline grant, which the agent seals to this
# boot's PCRs (the offline steps rely on it). The node held no grant
# before, so the outage itself is handled as without offline unlock.
p2_verifier_down() {
  P2_OFFLINE_POLICY=1
  write_policy "$MEASURED/v1/pcrs.yaml" "$MEASURED/v2/pcrs.yaml"
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
  check "audit: offline grant in the rejoin's ticket" verifier_logged \
    "msg=\"offline grant\" .*purpose=join .*offline_max_boots=$P2_OFFLINE_MAX_BOOTS offline_max_hours=$P2_OFFLINE_MAX_HOURS "
  check "agent sealed and stored the grant" serial_has 'msg="?offline grant stored"?'
  check_join skip
  step_done "verifier down at boot, back in time" "$BOOT_SECS" "$(boot_note); offline grant stored"
  if ! kill -0 "$VERIFIER_PID" 2>/dev/null; then verifier_start; fi
}

# ---------------------------------------------------------------- offline

# The offline steps: n1 holds the grant of the verifier-outage step
# (maxBoots 2, maxHours 24, sealed to v1's PCRs). "Power loss": the
# verifier and (kubeadm mode) the control plane stop, keeping their state;
# the guest finds no verifier for offline.after and unseals. The TPM
# counts every boot (TPM reset) after the granting attestation, offline
# or not, against maxBoots.

# p2_offline_down / p2_offline_up: the host's side goes down and comes
# back (the same cluster: CA, Node, Leases; the same master secret).
p2_offline_down() {
  verifier_stop
  if p2_k8s; then cp_ctl stop; fi
}
p2_offline_up() {
  if p2_k8s; then cp_ctl start; fi
  verifier_start
}
cp_ctl() {
  LATCHKEY_CP_DIR=$RUN_DIR/cp LATCHKEY_CP_NETNS=$P2_NETNS "$REPO/scripts/controlplane.sh" "$1" >>"$RUN_DIR/cp-$1.log" 2>&1 ||
    die "scripts/controlplane.sh $1 failed (see $RUN_DIR/cp-$1.log)"
}

# offline_line K: the agent's journal line of an offline unlock, boot K
# of maxBoots, with 23 or 24 hours left (the TPM's clock runs only while
# its swtpm does).
offline_line() {
  printf 'state disk unlocked offline \\(boot %s of %s, (%s|%s) hours left\\)' "$1" "$P2_OFFLINE_MAX_BOOTS" \
    "$((P2_OFFLINE_MAX_HOURS - 1))" "$P2_OFFLINE_MAX_HOURS"
}

not_offline() { ! serial_has 'unlocked offline \(boot'; }
# (boots the harness cuts short have no E2E report: the journal tells)
disk_never_opened() { ! serial_has 'msg="?state disk open'; }
kubelet_never_started() { ! serial_has 'Started kubelet'; }
online_status() { serial_has 'E2E: agent status node ready' && ! serial_has 'E2E: agent status .*offline'; }

# check_offline_boot K: the boot unlocked offline (boot K), nothing else.
check_offline_boot() {
  check "guest powered off" booted_cleanly
  check "agent tried the verifier for offline.after ($P2_OFFLINE_AFTER)" serial_has "no verifier answered; unlocking offline.*offline_after=$P2_OFFLINE_AFTER"
  check "journal: unlocked offline (boot $1 of $P2_OFFLINE_MAX_BOOTS, …)" serial_has "$(offline_line "$1")"
  check "status: node ready; unlocked offline (boot $1 …)" serial_has "E2E: agent status node ready; $(offline_line "$1" | sed 's/^state disk //')"
  check "agent ready" agent_ready
  check "same disk" test "$(disk_uuid)" == "${N1_UUID:-x}"
  check "disk open" disk_open
  check "marker kept" serial_has 'E2E: marker found, written by boot first'
  check "kubelet started" kubelet_started
  check "no luksFormat" not_formatted
  check "no kubeadm join" no_join_line
}

p2_offline() {
  p2_offline_first
  p2_offline_other_uki
  p2_offline_second
  p2_offline_spent
}

# p2_offline_first: boot 1 of 2 offline; once the guest logs it the host
# comes back (control plane, then verifier), and the agent's background
# re-attestation (Hello.offline.booted_offline) ends the offline state and
# renews the grant (counted from this boot).
p2_offline_first() {
  p2_offline_down
  audit_mark
  BOOT_TRIGGER_RE=$(offline_line 1)
  BOOT_TRIGGER_FN=p2_offline_up
  boot n1 offline-1 -- latchkey.e2e.await-online
  check_offline_boot 1
  check "host came back during the boot" test "$BOOT_TRIGGERED" == 1
  check "status ends the offline state after the re-attestation" serial_has 'E2E: agent status after the verifier came back node ready; re-attestation [0-9]+: attested'
  check "audit: no join or rejoin (the disk opened offline)" test "$(audit_count 'purpose=join')" -eq 0
  check "audit: node booted offline (boot 1 of $P2_OFFLINE_MAX_BOOTS)" verifier_logged \
    "msg=\"node booted offline\" .*offline_boot=1 offline_max_boots=$P2_OFFLINE_MAX_BOOTS purpose=reattest"
  check "audit: re-attestation accepted" audit_has 'purpose=reattest .*result=accepted'
  check "audit: grant renewed by the re-attestation" verifier_logged "msg=\"offline grant\" .*purpose=reattest .*offline_max_boots=$P2_OFFLINE_MAX_BOOTS "
  check "agent stored the renewed grant" serial_has 'msg="?offline grant stored"?'
  if p2_k8s; then
    check "host: node latchkey-e2e carries no unattested (offline) taint" kc untainted -node latchkey-e2e -timeout 60s
  fi
  # The agent cordons its Node if the API server came back before the
  # verifier answered; either way the re-attestation leaves it schedulable.
  if [[ $P2_JOIN == kubeadm ]]; then
    check "host: node latchkey-e2e not cordoned after the re-attestation" kc uncordoned -node latchkey-e2e -timeout 120s
  fi
  step_done "offline: boot 1 of $P2_OFFLINE_MAX_BOOTS, host back, re-attested" "$BOOT_SECS" "$(boot_note)"
}

# p2_offline_other_uki: host down again; UKI v2 (accepted by the policy,
# but the grant is sealed to v1's PCRs): the TPM refuses the unseal and
# the agent keeps trying the verifier until its timeout, then exits
# VerifierUnreachable (4), which systemd restarts: the boot would never
# end, so the harness cuts the power at that exit. The disk stays shut.
P2_AGENT_EXIT4='latchkey-agent.service: Main process exited, code=exited, status=4/'
p2_offline_other_uki() {
  p2_offline_down
  node_esp n1 v2
  audit_mark
  boot n1 offline-other-uki --kill-on "$P2_AGENT_EXIT4"
  node_esp n1 v1
  check "power cut when the agent gave up (exit 4)" test "$BOOT_END" == killed
  check "agent gave up: verifier unreachable (exit 4)" serial_has "$P2_AGENT_EXIT4"
  check "tpm refused the unseal: PCRs 4 and 11 differ" serial_has \
    "offline unlock refused by the TPM; retrying the verifiers.*this boot's measurements differ from the grant's \\(PCRs differing: \\[4 .*11\\]\\)"
  check "no offline unlock" not_offline
  check "disk never opened" disk_never_opened
  check "kubelet not started" kubelet_never_started
  check "verifier stayed down (no audit line)" test "$(audit_count .)" -eq 0
  step_done "offline: another UKI does not unlock" "$BOOT_SECS" "v2: TPM refused (PCRs 4, 9, 11), agent exit 4, power cut"
}

# p2_offline_second: boot 2 of 2 since the re-attestation that renewed the
# grant (the refused boot counted too); without that renewal the bound
# would already be spent. The control plane is back before this boot, the
# verifier is not (an outage of the verifier alone): with a real kubelet
# the agent cordons its own Node with the kubelet's credentials, which
# the host sees while the guest holds; p2_offline_spent shows the
# verifier lifting the cordon once the node re-attests.
p2_offline_second() {
  if p2_k8s; then cp_ctl start; fi
  audit_mark
  [[ $P2_JOIN == kubeadm ]] && p2_hold p2_live_cordoned
  # shellcheck disable=SC2046 # no knob or one word
  boot n1 offline-2 -- $(p2_hold_arg)
  check_offline_boot 2
  check "verifier stayed down (no audit line)" test "$(audit_count .)" -eq 0
  local note
  note=$(boot_note)
  if [[ $P2_JOIN == kubeadm ]]; then
    check_live
    check "agent: node cordoned while offline" serial_has 'msg="?node cordoned while offline'
    note="$note; Node cordoned by the agent"
  fi
  step_done "offline: boot 2 of $P2_OFFLINE_MAX_BOOTS (renewed grant), verifier alone down" "$BOOT_SECS" "$note"
}

# p2_live_cordoned: while the guest holds, its Node is cordoned with
# latchkey's annotation (the agent's, with the kubelet's credentials: no
# verifier runs), and carries no taint (nothing could set one).
p2_live_cordoned() {
  check "host: node latchkey-e2e cordoned by latchkey (verifier down)" kc cordoned -node latchkey-e2e -timeout 120s
  check "host: node latchkey-e2e carries no unattested taint (no verifier ran)" kc untainted -node latchkey-e2e
  echo "done" >"$HOLD_FILE"
}

# p2_offline_spent: the next boot is past maxBoots: the TPM refuses naming
# the boot bound and the agent waits for a verifier as without a grant.
# The control plane is back since p2_offline_second, the verifier comes
# when the agent logs the refusal: a rejoin opens the disk and renews the
# grant; the re-attestations that follow lift the agent's cordon of the
# offline boot before.
p2_offline_spent() {
  audit_mark
  BOOT_TRIGGER_RE='offline unlock refused by the TPM'
  BOOT_TRIGGER_FN=verifier_start
  boot n1 offline-spent
  check "guest powered off" booted_cleanly
  check "tpm refused the unseal: boot bound reached" serial_has 'offline unlock refused by the TPM; retrying the verifiers.*offline grant spent: boot bound reached'
  check "no offline unlock" not_offline
  check "verifier restarted during the boot" test "$BOOT_TRIGGERED" == 1
  check "agent ready" agent_ready
  check "status: node ready, not offline" online_status
  check "same disk" test "$(disk_uuid)" == "${N1_UUID:-x}"
  check "marker kept" serial_has 'E2E: marker found, written by boot first'
  check "no luksFormat" not_formatted
  check "audit: rejoin accepted" audit_has 'result=accepted' 'rejoin=true'
  check "audit: grant renewed by the rejoin" verifier_logged "msg=\"offline grant\" .*purpose=join .*offline_max_boots=$P2_OFFLINE_MAX_BOOTS "
  check "agent stored the renewed grant" serial_has 'msg="?offline grant stored"?'
  check "agent re-attested twice after the boot" serial_has 'E2E: re-attested ([2-9]|[1-9][0-9])'
  check_join skip
  if p2_k8s; then
    check "host: node latchkey-e2e carries no unattested taint" kc untainted -node latchkey-e2e -timeout 60s
  fi
  if [[ $P2_JOIN == kubeadm ]]; then
    check "host: node latchkey-e2e uncordoned, latchkey's annotation gone" kc uncordoned -node latchkey-e2e -timeout 120s
    check "verifier: lifted latchkey's cordon" verifier_logged "msg=\"node attested after its offline boot; latchkey's cordon lifted\" .*node=latchkey-e2e"
  fi
  step_done "offline: spent after $P2_OFFLINE_MAX_BOOTS boots, waits, rejoins" "$BOOT_SECS" "$(boot_note)"
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
  # (A disk-only verifier binds no node names: nothing to release.)
  if p2_k8s; then
    check "operator releases n1's node name" "$P2_BIN/latchkey-verifier" bindings release \
      --node latchkey-e2e --socket "$RUN_DIR/verifier/admin.sock"
    check "release audited" grep -qE 'msg="binding released by admin".* kind=node name=latchkey-e2e ' "$VERIFIER_LOG"
  fi
  # With a real kubelet the operator also deletes n1's Node, as for any
  # replaced machine (kubeadm join refuses a name whose Node is Ready).
  [[ $P2_JOIN == kubeadm ]] && check "operator deletes n1's Node" kc node-delete -node latchkey-e2e
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
  [[ $P2_JOIN == kubeadm ]] && p2_hold p2_live_recover
  # shellcheck disable=SC2046
  boot n2 recover -- $(p2_hold_arg)
  check "guest powered off" booted_cleanly
  check "agent ready" agent_ready
  check "not reformatted (same uuid)" test "$(disk_uuid)" == "$crash_uuid"
  check "no second luksFormat" not_formatted
  check "disk open" disk_open
  check "bind mounts" binds_on_state
  check "marker written" serial_has 'E2E: marker written by boot recover'
  check "audit: rejoin accepted" audit_has 'result=accepted' 'rejoin=true'
  check_join join
  check_live
  step_done "crash recovery: finish without reformat" "$BOOT_SECS" "$(boot_note)"
}

# p2_hostile (real kubelet): a third machine, attested as P2_EVIL_NODE
# (its own name, bound to its own TPM, a token minted for it), whose
# kubelet asks for P2_VICTIM_NODE's certificate (--hostname-override from
# the harness knob). latchkey's approver must deny the CSR, with its
# reason; no certificate is issued and neither Node appears. The host
# checks while kubeadm waits for the TLS bootstrap, then cuts the power.
p2_hostile() {
  node_create n3
  audit_mark
  LIVE_SINCE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  BOOT_TRIGGER_RE='running kubeadm join'
  BOOT_TRIGGER_FN=p2_live_hostile
  BOOT_KILL_AFTER_TRIGGER=1
  boot n3 hostile -- "latchkey.e2e.hostname=$P2_EVIL_NODE" "latchkey.e2e.kubelet-name=$P2_VICTIM_NODE"
  check "guest took its attested name" serial_has "E2E: hostname $P2_EVIL_NODE"
  check "audit: $P2_EVIL_NODE accepted, token minted" audit_has "node=$P2_EVIL_NODE .*result=accepted" 'token_id='
  check "kubelet asked to be $P2_VICTIM_NODE" serial_has "E2E: kubelet asks to be node $P2_VICTIM_NODE"
  check "host checks ran during the join" test "$BOOT_TRIGGERED" == 1
  check "power cut after the checks" test "$BOOT_END" == killed
  check "kubeadm join did not succeed" not_joined
  step_done "hostile kubelet: another node's name" "$BOOT_SECS" "CSR for $P2_VICTIM_NODE denied; no Node"
}

p2_live_hostile() {
  check "host: CSR for $P2_VICTIM_NODE denied by latchkey" kc csr-denied -node "$P2_VICTIM_NODE" -since "$LIVE_SINCE" -timeout 300s
  check "verifier: approver logged the denial" grep -qE 'msg="CSR decided".*verdict=deny' "$VERIFIER_LOG"
  check "host: no node $P2_VICTIM_NODE" kc node-absent -node "$P2_VICTIM_NODE"
  check "host: no node $P2_EVIL_NODE" kc node-absent -node "$P2_EVIL_NODE"
}
