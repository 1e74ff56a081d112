#!/usr/bin/env bash
# Runs inside a private mount namespace (scripts/check-units.sh starts it
# with `unshare --mount`): a real systemd user manager loads the real
# latchkey-agent.service (ExecStart= swapped for a simulator) and the real
# kubelet drop-in next to a kubelet stand-in, and plays boots:
#   good        READY, then "kubeadm" restarts kubelet        -> both active
#   late-ready  "kubeadm" before READY                        -> kubeadm's
#               `systemctl restart kubelet` hangs: why READY comes first
#   refused     exit 3                                        -> no restart,
#               kubelet never starts
#   unreachable exit 4 once, then fine                        -> restarted,
#               kubelet started after all
# then: stopping the agent stops kubelet; kubelet alone refuses to start.
# Given a real latchkey-verifier binary, it also starts the real verifier
# unit and socket (loopback port, throwaway config): READY under the
# unit's seccomp filter with no capabilities, TLS 1.3 on the socket systemd
# passed, watchdog pings, a clean stop on SIGTERM. A user manager cannot
# apply DynamicUser=, and this container refuses the read-only /proc/sys,
# /dev/kmsg and home mounts, so those four settings are relaxed there.
# Prints "ok ..." / "FAIL ..." lines; exit status 1 on any failure.
#
#   unit-semantics.sh REPO [VERIFIER_BINARY]
#
# Everything it makes lives on tmpfs mounts of its own mount namespace
# (under /mnt, outside PrivateTmp='s and ProtectHome='s reach) and vanishes
# with it.
set -uo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

REPO=$1
VERIFIER=${2:-}
FAILS=0

# systemd --user insists on a system booted with systemd: fake the marker
# in this namespace only.
if [[ -d /run/systemd ]]; then mount -t tmpfs tmpfs /run/systemd; else mount -t tmpfs tmpfs /run; fi
mkdir -p /run/systemd/system
mount -t tmpfs tmpfs /mnt || die "cannot mount a tmpfs on /mnt"
W=/mnt/latchkey-units
U=$W/home/.config/systemd/user
export HOME=$W/home XDG_RUNTIME_DIR=$W/run
mkdir -p "$XDG_RUNTIME_DIR" "$U/latchkey-agent.service.d" "$U/kubelet.service.d" "$U/containerd.service.d"
chmod 0700 "$XDG_RUNTIME_DIR"

cp "$REPO/units/latchkey-agent.service" "$U/"
cp "$REPO/units/kubelet.service.d/50-latchkey.conf" "$U/kubelet.service.d/"
cp "$REPO/units/containerd.service.d/50-latchkey.conf" "$U/containerd.service.d/"
cat >"$U/latchkey-agent.service.d/zz-simulator.conf" <<CONF
[Service]
ExecStart=
ExecStart=$W/agent-sim.sh
# systemd-notify is a child of the simulator, not its main process.
NotifyAccess=all
RestartSec=1s
CONF
printf '[Service]\nExecStart=/bin/sleep infinity\nRestart=always\nRestartSec=1\n' >"$U/kubelet.service"
printf '[Service]\nExecStart=/bin/sleep infinity\n' >"$U/containerd.service"
printf '[Unit]\nWants=latchkey-agent.service kubelet.service containerd.service\n' >"$U/boot.target"

cat >"$W/agent-sim.sh" <<SIM
#!/bin/bash
n=\$(( \$(cat $W/attempts 2>/dev/null || echo 0) + 1 )); echo \$n >$W/attempts
kubeadm() {
  if timeout 5 systemctl --user restart kubelet.service; then echo restarted >$W/kubeadm; else echo hung >$W/kubeadm; fi
}
case \$(cat $W/mode) in
  good) systemd-notify --ready; kubeadm ;;
  late-ready) kubeadm; systemd-notify --ready ;;
  refused) exit 3 ;;
  unreachable) [[ \$n == 1 ]] && exit 4; systemd-notify --ready; kubeadm ;;
esac
SIM
chmod 0755 "$W/agent-sim.sh"

/lib/systemd/systemd --user --log-target=console >"$W/systemd.log" 2>&1 &
SD=$!
trap 'kill $SD 2>/dev/null; wait $SD 2>/dev/null' EXIT
for _ in $(seq 100); do systemctl --user is-system-running >/dev/null 2>&1 && break; sleep 0.1; done

u() { systemctl --user "$@"; }
st() { echo "$(u show -p ActiveState --value "$1")/$(u show -p Result --value "$1")"; }
check() {
  if [[ $2 == "$3" ]]; then echo "ok    $1"; else echo "FAIL  $1: got $2, want $3"; FAILS=$((FAILS + 1)); fi
}
# settle waits until no job is queued and the simulator has finished.
settle() {
  for _ in $(seq 150); do
    [[ -z $(u list-jobs --no-legend 2>/dev/null) ]] && ! pgrep -f "$W/agent-sim.sh" >/dev/null && return
    sleep 0.1
  done
}
boot() {
  u stop boot.target kubelet.service containerd.service latchkey-agent.service 2>/dev/null
  u reset-failed 2>/dev/null
  echo "$1" >"$W/mode"
  rm -f "$W/attempts" "$W/kubeadm"
  timeout 30 systemctl --user start boot.target 2>/dev/null
  settle
  [[ $1 != unreachable ]] || { sleep 1.5; settle; }
}

boot good
check "good boot: agent" "$(st latchkey-agent.service)" active/success
check "good boot: kubelet" "$(st kubelet.service)" active/success
check "good boot: containerd" "$(st containerd.service)" active/success
check "good boot: kubeadm restarts kubelet after READY" "$(cat "$W/kubeadm")" restarted

boot late-ready
check "READY after kubeadm: kubeadm's systemctl restart kubelet hangs" "$(cat "$W/kubeadm")" hung

boot refused
check "refused (exit 3): agent not restarted" "$(cat "$W/attempts")/$(st latchkey-agent.service)" 1/failed/exit-code
check "refused (exit 3): kubelet never starts" "$(u show -p ActiveState --value kubelet.service)" inactive
check "refused (exit 3): containerd never starts" "$(u show -p ActiveState --value containerd.service)" inactive

boot unreachable
check "unreachable (exit 4): agent restarted, then ready" "$(cat "$W/attempts")/$(st latchkey-agent.service)" 2/active/success
check "unreachable (exit 4): kubelet starts after the restart" "$(st kubelet.service)" active/success

u stop latchkey-agent.service
settle
check "stopping the agent stops kubelet" "$(u show -p ActiveState --value kubelet.service)" inactive
u start kubelet.service 2>/dev/null
check "kubelet alone, agent inactive: start fails" "$? $(u show -p ActiveState --value kubelet.service)" "1 inactive"

verifier_smoke() {
  local v=$W/verifier port=17443 pid out id
  mkdir -p "$v" "$U/latchkey-verifier.service.d" "$U/latchkey-verifier.socket.d"
  cp "$VERIFIER" "$v/latchkey-verifier"
  head -c 32 /dev/urandom >"$v/master-secret"
  chmod 600 "$v/master-secret" # the verifier refuses a secret others can read
  printf 'apiVersion: latchkey/v1\ntpm:\n  pcrs:\n    "7": ["%064d"]\n  ekPublicKeyHashes: ["sha256:%064d"]\n' 0 0 >"$v/policy.yaml"
  printf 'policy: %s\nclusterSalt: unit-smoke\n' "$v/policy.yaml" >"$v/verifier.yaml"
  cp "$REPO/units/latchkey-verifier.service" "$REPO/units/latchkey-verifier.socket" "$U/"
  cat >"$U/latchkey-verifier.service.d/zz-smoke.conf" <<CONF
[Service]
ExecStart=
ExecStart=$v/latchkey-verifier serve --config $v/verifier.yaml --master-secret-file $v/master-secret --listen 127.0.0.1:0
StandardError=file:$v/stderr
WatchdogSec=2s
# user-manager / container limits, not relaxations of the shipped unit
DynamicUser=no
ProtectHome=no
ProtectKernelTunables=no
ProtectKernelLogs=no
CONF
  printf '[Socket]\nListenStream=\nListenStream=127.0.0.1:%s\n' "$port" >"$U/latchkey-verifier.socket.d/zz-smoke.conf"
  u daemon-reload
  u start latchkey-verifier.socket
  timeout 30 systemctl --user start latchkey-verifier.service 2>/dev/null
  check "verifier unit: READY under its sandbox" "$(st latchkey-verifier.service)" active/success
  pid=$(u show -p MainPID --value latchkey-verifier.service)
  check "verifier unit: seccomp filter, no capabilities, no new privileges" \
    "$(awk '/^(Seccomp|CapBnd|NoNewPrivs):/ {printf "%s%s ", $1, $2}' "/proc/$pid/status" 2>/dev/null)" \
    "CapBnd:0000000000000000 NoNewPrivs:1 Seccomp:2 "
  out=$(timeout 5 openssl s_client -connect "127.0.0.1:$port" -brief </dev/null 2>&1)
  check "verifier unit: TLS 1.3 on the socket systemd passed (sdnotify.TakeSockets)" \
    "$(grep -o 'Protocol version: TLSv1.3' <<<"$out")" "Protocol version: TLSv1.3"
  # Without pings systemd kills it after WatchdogSec=; the socket would
  # then start a new instance, so compare the invocation, not the state.
  id=$(u show -p InvocationID --value latchkey-verifier.service)
  sleep 3
  check "verifier unit: watchdog pinged, same instance after 3s (sdnotify.Watchdog)" \
    "$(st latchkey-verifier.service) $(u show -p InvocationID --value latchkey-verifier.service)" "active/success $id"
  u stop latchkey-verifier.socket
  u stop latchkey-verifier.service
  check "verifier unit: clean stop on SIGTERM" \
    "$(st latchkey-verifier.service) status=$(u show -p ExecMainStatus --value latchkey-verifier.service)" "inactive/success status=0"
  [[ $FAILS == 0 ]] || sed 's/^/      verifier: /' "$v/stderr" >&2
}

if [[ -n $VERIFIER ]]; then verifier_smoke; fi

exit $((FAILS > 0))
