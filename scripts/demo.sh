#!/usr/bin/env bash
# The latchkey demo: a machine with a (software) TPM proves itself to a
# verifier over attested TLS and gets its disk key; then a boot component
# changes, and the same machine is refused with the reason.
#
# Runs on a fresh Debian machine as root: installs what is missing, builds,
# starts swtpm (EK certificate from a throwaway CA), captures a policy with
# `latchkey-agent measure`, starts the verifier with embedded defaults
# (throwaway master secret, self-signed certificate, disk-only mode), runs
# the agent, extends a PCR and runs it again. Everything it starts is
# stopped on exit.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
root=$(repo_root)
cd "$root"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
step() { printf '   %s\n' "$*"; }

need_go
need_packages swtpm:swtpm swtpm_setup:swtpm-tools tpm2_pcrextend:tpm2-tools python3:python3

work=$(mktemp -d /tmp/latchkey-demo.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [[ -f $work/tpm/swtpm.pid ]] && kill "$(cat "$work/tpm/swtpm.pid")" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

say "build"
bin=$(cache_dir)/bin
go build -trimpath -o "$bin/" ./agent/cmd/latchkey-agent ./verifier/cmd/latchkey-verifier
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
    --no-join --timeout "${1:-60s}" 2>&1
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
say "done: key released to the measured machine, refused after tampering (agent exit $code = refused by policy)"
