#!/usr/bin/env bash
# latchkey's benchmarks, the source of docs/benchmarks.md. Speed targets
# live here, never in timed unit tests.
#
#   scripts/bench.sh           all benchmarks
#   scripts/bench.sh tpm|agent|disk|snp|offline|load|storm
#
# agent starts the shipped build as a process; LATCHKEY_AGENT_COMPARE=BIN
# runs another agent binary alternately in the same run.
#
# storm (root: the real control plane in a network namespace) is the
# whole-join boot storm, scripts/bench-storm.sh.
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "$0")/lib/common.sh"
cd "$(repo_root)"
need_go
what=${1:-all}
run() { printf '\n\033[1m== %s\033[0m\n' "$1"; shift; "$@" 2>&1 | grep -E '^(Benchmark|goos|cpu|PASS|FAIL|ok)|ratio|joins|p50|p99|rss' || true; }

if [[ $what == all || $what == tpm ]]; then
  run "TPM validation alone and a full join against swtpm" \
    go test -run '^$' -bench 'BenchmarkValidate|BenchmarkQuoteSwtpm' -benchtime 2s ./attest/tpm/
  run "full in-process join (TLS handshake, swtpm quote and activation, validation)" \
    go test -run '^$' -bench 'BenchmarkFullJoinTPM' -benchtime 50x ./verifier/app/
fi
if [[ $what == all || $what == agent ]]; then
  run "agent start-up: in process, and the shipped build as a process (key-only boot, version, hello world)" \
    go test -run '^$' -bench 'StartToReady' -benchtime 30x ./agent/cmd/latchkey-agent/
fi
if [[ $what == all || $what == disk ]]; then
  run "LUKS: unseal and the agent's disk step (root)" \
    go test -run '^$' -bench . -benchtime 20x ./agent/disk/
fi
if [[ $what == all || $what == snp ]]; then
  run "SNP validation (cached chain) vs one bare P-384 verify" \
    go test -run '^$' -bench . -benchtime 2s ./attest/snp/
fi
if [[ $what == all || $what == offline ]]; then
  run "offline unlock (swtpm) vs clevis decrypt of a tpm2 pin on the same swtpm, alternating" \
    go test -run '^$' -bench 'BenchmarkOfflineUnlock' -benchtime 30x ./attest/tpm/offline/
fi
if [[ ( $what == all || $what == load ) && -x scripts/bench-load.sh ]]; then
  run "SNP load: verifier process, concurrent agents over loopback TLS" scripts/bench-load.sh
fi
if [[ $what == all || $what == storm ]]; then
  printf '\n\033[1m== %s\033[0m\n' "whole-join storm: latchkey-verifier process, real control plane, SNP and swtpm agents"
  if [[ $EUID -eq 0 ]]; then
    scripts/bench-storm.sh 2>&1 | grep -vE '^(goos|goarch|pkg|cpu):' || true
  else
    echo "skipped: needs root (network namespace, swtpm)"
  fi
fi
