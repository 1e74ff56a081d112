#!/usr/bin/env bash
# The latchkey demo: a machine with a (software) TPM proves itself to a
# verifier over attested TLS and gets its disk key; then a boot component
# changes, and the same machine is refused with the reason.
#
# Runs on a fresh Debian machine as root: installs what is missing, builds,
# starts swtpm (EK certificate from a throwaway CA), captures a policy with
# `latchkey-agent measure`, starts the verifier with embedded defaults
# (throwaway master secret, self-signed certificate, disk-only mode), runs
# the agent, extends a PCR and runs it again.
#
# Then, when the Kubernetes binaries are built (scripts/k8s/build.sh; the
# first build takes 20-70 minutes on two cores, so it runs only when they are
# cached or with --kubernetes), a second act: a real control plane
# (etcd, kube-apiserver, kube-controller-manager laid out by kubeadm) in its
# own network namespace, the verifier minting a bootstrap token there, and
# the agent's kubeadm join --dry-run passing real discovery with it.
# --no-kubernetes skips that act. Everything the demo starts is stopped on
# exit.
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "$0")/lib/common.sh"
root=$(repo_root)
cd "$root"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
step() { printf '   %s\n' "$*"; }

k8s=auto
case ${1:-} in
  --kubernetes) k8s=yes ;;
  --no-kubernetes) k8s=no ;;
  "") ;;
  *) echo "usage: $0 [--kubernetes|--no-kubernetes]" >&2; exit 2 ;;
esac

need_go
need_packages swtpm:swtpm swtpm_setup:swtpm-tools tpm2_pcrextend:tpm2-tools python3:python3

work=$(mktemp -d /tmp/latchkey-demo.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for f in "$work"/*/swtpm.pid; do
    if [[ -f $f ]]; then kill "$(cat "$f")" 2>/dev/null || true; fi
  done
  if [[ ${cp_up:-} == 1 ]]; then "$root/scripts/controlplane.sh" down >/dev/null 2>&1 || true; fi
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

say "build"
bin=$(cache_dir)/bin
# The shipped build: static, stripped, no gRPC tracing (image/README.md).
CGO_ENABLED=0 go build -trimpath -tags grpcnotrace -ldflags='-s -w' -o "$bin/" ./agent/cmd/latchkey-agent ./verifier/cmd/latchkey-verifier
step "latchkey-agent and latchkey-verifier in $bin"

say "a software TPM with an EK certificate from a throwaway CA"
ekca=$(swtpm_manufacture "$work/tpm")
tpm_port=$(free_port)
swtpm_start "$work/tpm" "$tpm_port"
wait_port "$tpm_port"
step "swtpm on 127.0.0.1:$tpm_port, EK CA $ekca"
tpm=tcp://127.0.0.1:$tpm_port
pcrs_flag=(--tpm-device "$tpm" --kernel-cmdline /dev/null --config /dev/null)

say "golden policy: latchkey-agent measure"
"$bin/latchkey-agent" measure "${pcrs_flag[@]}" >"$work/policy.yaml"
{
  echo "  ekCARoots:"
  echo "  - |"
  sed 's/^/    /' "$ekca"
} >>"$work/policy.yaml"
grep -E '^(apiVersion|tpm)|^  [a-zA-Z]' "$work/policy.yaml" | sed 's/^/   /'
step "(PCR digests and the EK CA omitted; the policy is $work/policy.yaml)"

say "verifier: embedded defaults, disk-only mode"
head -c 32 /dev/urandom >"$work/master-secret"
chmod 600 "$work/master-secret"
port=$(free_port)
"$bin/latchkey-verifier" serve --listen "127.0.0.1:$port" --policy "$work/policy.yaml" \
  --state-dir "$work/verifier" --master-secret-file "$work/master-secret" --cluster-salt demo-cluster \
  >"$work/verifier.log" 2>&1 &
pids+=($!)
wait_port "$port"
pin=$("$bin/latchkey-verifier" pin --state-dir "$work/verifier")
step "verifier on 127.0.0.1:$port, pin $pin"

agent() {
  "$bin/latchkey-agent" run "${pcrs_flag[@]}" --verifier "127.0.0.1:$port" --pin "$pin" \
    --node-name demo-node --disk-mode key-only --disk-uuid 6c0e2f5a-4b1d-4e8f-9a3c-2d7b5e1f0a94 \
    --no-join --no-reattest --timeout "${1:-60s}" 2>&1
}
show() { grep -E "$1" | sed -E 's/^time=[^ ]+ //; s/^/   agent: /'; }

say "join: the agent attests and receives its disk key"
agent 60s | tee "$work/agent1.log" | show 'state disk|boot|failed|refused'
grep -q 'boot complete' "$work/agent1.log"
grep 'join decision' "$work/verifier.log" | tail -1 | sed -E 's/^time=[^ ]+ //; s/^/   verifier: /'

say "tamper: extend PCR 14 (a changed boot component), join again"
TPM2TOOLS_TCTI="swtpm:host=127.0.0.1,port=$tpm_port" tpm2_pcrextend \
  "14:sha256=$(printf 'changed component' | sha256sum | cut -d' ' -f1)"
step "PCR 14 extended"
set +e
agent 8s >"$work/agent2.log"
code=$?
set -e
show 'refused|failed' <"$work/agent2.log" | head -2
grep 'join decision' "$work/verifier.log" | tail -1 | sed -E 's/^time=[^ ]+ //; s/^/   verifier: /'
if [[ $code != 3 ]] || ! grep -q 'PCR_MISMATCH' "$work/agent2.log"; then
  echo "demo: expected a PCR_MISMATCH refusal (exit 3), got exit $code" >&2
  exit 1
fi
step "key released to the measured machine, refused after tampering (agent exit $code = refused by policy)"

kubeadm_bin=$(cache_dir)/k8s/v1.37.2/kubeadm
if [[ $k8s == no || ( $k8s == auto && ! -x $kubeadm_bin ) ]]; then
  say "done (Kubernetes act skipped: run '$0 --kubernetes' to build the control plane binaries and join a real cluster)"
  exit 0
fi

say "a real control plane: kubeadm phases, etcd, kube-apiserver, kube-controller-manager in netns latchkey-cp"
envfile=$("$root/scripts/controlplane.sh" up 2>"$work/controlplane.log")
cp_up=1
# shellcheck source=/dev/null # controlplane.sh writes it at run time
source "$envfile"
inns() { ip netns exec "$LATCHKEY_K8S_NETNS" "$@"; }
step "API server $LATCHKEY_K8S_ENDPOINT, cluster CA $LATCHKEY_K8S_CA_HASH"

say "a fresh node TPM inside the namespace, its golden policy, a verifier with Kubernetes"
ekca=$(swtpm_manufacture "$work/tpm2")
inns bash -c "source '$root/scripts/lib/common.sh'; swtpm_start '$work/tpm2' 2321"
inns bash -c "source '$root/scripts/lib/common.sh'; wait_port 2321"
node_tpm=(--tpm-device tcp://127.0.0.1:2321 --kernel-cmdline /dev/null --config /dev/null)
inns "$bin/latchkey-agent" measure "${node_tpm[@]}" >"$work/policy2.yaml"
cat >"$work/verifier2.yaml" <<CONF
listen: 127.0.0.1:7443
policy: $work/policy2.yaml
stateDir: $work/verifier2
masterSecretFile: $work/master-secret
clusterSalt: demo-cluster
adminSocket: "-"
kubernetes:
  kubeconfig: $LATCHKEY_K8S_VERIFIER_KUBECONFIG
  tokenTTL: 15m
CONF
inns "$bin/latchkey-verifier" serve --config "$work/verifier2.yaml" >"$work/verifier2.log" 2>&1 &
pids+=($!)
inns bash -c "source '$root/scripts/lib/common.sh'; wait_port 7443"
pin2=$("$bin/latchkey-verifier" pin --config "$work/verifier2.yaml")
step "verifier on 127.0.0.1:7443 (netns), narrow credential $LATCHKEY_K8S_VERIFIER_KUBECONFIG"

say "join: attest, get a bootstrap token, kubeadm join --dry-run against the real API server"
set +e
inns "$bin/latchkey-agent" run "${node_tpm[@]}" --verifier 127.0.0.1:7443 --pin "$pin2" --node-name demo-node-1 \
  --disk-mode key-only --disk-uuid 2f1d0c9e-8b7a-4c6d-9e5f-1a2b3c4d5e6f --kubeadm "$kubeadm_bin" \
  --kubeadm-dry-run --ignore-preflight-errors all --no-reattest --timeout 60s >"$work/agent3.log" 2>&1
code=$?
set -e
show 'state disk open|msg="running kubeadm join"|kubeadm join succeeded|boot complete|failed' <"$work/agent3.log"
grep 'join decision' "$work/verifier2.log" | tail -1 | sed -E 's/^time=[^ ]+ //; s/^/   verifier: /'
token_id=$(grep -o 'token_id=[a-z0-9]*' "$work/verifier2.log" | tail -1 | cut -d= -f2)
if [[ $code != 0 ]]; then
  echo "demo: the join against the control plane failed (exit $code); see $work/agent3.log" >&2
  cat "$work/agent3.log" >&2
  exit 1
fi
step "bootstrap token $token_id minted by the verifier, accepted by kubeadm's own file discovery (the ticket's pinned CA bundle, the token)"
say "done: attested disk key, refusal after tampering, and a token the real kubeadm accepts"
