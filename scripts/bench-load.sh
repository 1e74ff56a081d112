#!/usr/bin/env bash
# SNP load benchmark: the verifier in its own process, driven by
# many concurrent agents over loopback TLS, each join with a freshly signed
# SEV-SNP report (go-sev-guest's test signer) bound to its own session and
# a token minted in memory. Prints joins/s, p50/p99, the verifier's CPU per
# join against one bare P-384 verification measured in the same run, and
# the verifier's RSS. See scripts/bench/load for how.
#
#   scripts/bench-load.sh [-c AGENTS] [-n JOINS] [-w WARMUP] [-r PACED_RATE]
#                         [-f FRACTIONS] [-t PACED_TIME] [-s STORM_FACTOR]
#                         [-T STORM_TIME] [-p PROFILE_FILE] [-e VERIFIER_ENV]
#                         [-S TIMER_SLACK]
#
#   -c  concurrent agents                 (LATCHKEY_LOAD_CONCURRENCY, 256)
#   -n  joins in the measured closed loop (LATCHKEY_LOAD_JOINS, 6000)
#   -w  warm-up joins                     (LATCHKEY_LOAD_WARMUP, 512)
#   -r  joins/s of the paced phase; 0 = half the closed-loop rate, -1 = none
#                                         (LATCHKEY_LOAD_PACED_RATE, 0)
#   -f  paced phases at these fractions of the closed-loop rate instead,
#       comma-separated (0.1,0.5,1: CPU per join at 10, 50 and 100 % of
#       capacity against the closed loop's)  (LATCHKEY_LOAD_PACED_FRACTIONS)
#   -t  length of each paced phase        (LATCHKEY_LOAD_PACED_TIME, 15s)
#   -s  storm phase: joins arrive open-loop at this multiple of the
#       closed-loop rate, each a new node (admission control and
#       retry-after); 0 = none              (LATCHKEY_LOAD_STORM_FACTOR, 3)
#   -T  arrival window of the storm        (LATCHKEY_LOAD_STORM_TIME, 10s)
#   -a  the verifier's limits.maxJoinsInFlight; 0 = its default
#                                         (LATCHKEY_LOAD_MAX_IN_FLIGHT, 0)
#   -p  write the verifier's CPU profile of the closed loop there (of the
#       paced phase to PROFILE_FILE.paced, or .paced-NNN with -f) and print
#       the closed loop's top functions   (LATCHKEY_LOAD_CPUPROFILE)
#   -e  environment of the verifier process only, space-separated, for
#       example "GODEBUG=gctrace=1"; its stderr is then kept next to the
#       test binary as verifier.log       (LATCHKEY_LOAD_VERIFIER_ENV)
#   -S  start the verifier with this timer slack, as a unit's
#       TimerSlackNSec= would (an experiment: the unit sets none);
#       0 = the kernel's default          (LATCHKEY_LOAD_TIMER_SLACK, 0)
#
# Loopback only; it stops by itself (joins bounded by -load.timeout 5m,
# the whole run by a 10-minute timeout). The load generator shares the
# machine with the verifier: the headline is the verifier's own CPU time.
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "$0")/lib/common.sh"
cd "$(repo_root)"
need_go

agents=${LATCHKEY_LOAD_CONCURRENCY:-256}
joins=${LATCHKEY_LOAD_JOINS:-6000}
warmup=${LATCHKEY_LOAD_WARMUP:-512}
rate=${LATCHKEY_LOAD_PACED_RATE:-0}
paced_time=${LATCHKEY_LOAD_PACED_TIME:-15s}
profile=${LATCHKEY_LOAD_CPUPROFILE:-}
storm=${LATCHKEY_LOAD_STORM_FACTOR:-3}
storm_time=${LATCHKEY_LOAD_STORM_TIME:-10s}
inflight=${LATCHKEY_LOAD_MAX_IN_FLIGHT:-0}
fractions=${LATCHKEY_LOAD_PACED_FRACTIONS:-}
venv=${LATCHKEY_LOAD_VERIFIER_ENV:-}
slack=${LATCHKEY_LOAD_TIMER_SLACK:-0}
while getopts c:n:w:r:f:t:s:T:a:p:e:S:h opt; do
  case $opt in
    c) agents=$OPTARG ;;
    n) joins=$OPTARG ;;
    w) warmup=$OPTARG ;;
    r) rate=$OPTARG ;;
    f) fractions=$OPTARG ;;
    t) paced_time=$OPTARG ;;
    s) storm=$OPTARG ;;
    T) storm_time=$OPTARG ;;
    a) inflight=$OPTARG ;;
    p) profile=$OPTARG ;;
    e) venv=$OPTARG ;;
    S) slack=$OPTARG ;;
    *) sed -n '2,41p' "$0" >&2; exit 2 ;;
  esac
done

bin="$(cache_dir)/bench/load.test"
mkdir -p "$(dirname "$bin")"
go test -c -o "$bin" ./scripts/bench/load

args=(-test.run '^$' -test.bench '^BenchmarkSNPLoad$' -test.benchtime 1x -test.timeout 10m
  -load.concurrency "$agents" -load.joins "$joins" -load.warmup "$warmup"
  -load.paced-rate "$rate" -load.paced-time "$paced_time"
  -load.storm-factor "$storm" -load.storm-time "$storm_time" -load.max-in-flight "$inflight"
  -load.verifier-timerslack "$slack")
if [[ -n $profile ]]; then
  profile=$(realpath -m "$profile")
  args+=(-load.cpuprofile "$profile")
fi
if [[ -n $fractions ]]; then
  args+=(-load.paced-fractions "$fractions")
fi
if [[ -n $venv ]]; then
  args+=(-load.verifier-env "$venv" -load.verifier-log "$(dirname "$bin")/verifier.log")
fi
echo "command (reproduces these joins): LATCHKEY_LOAD_BENCH=1 $bin ${args[*]}"
LATCHKEY_LOAD_BENCH=1 timeout --signal TERM --kill-after 30s 11m "$bin" "${args[@]}"

if [[ -n $profile ]]; then
  printf '\nverifier CPU profile of the closed loop (%s), flat and cumulative:\n' "$profile"
  go tool pprof -top -nodecount 35 "$bin" "$profile" 2>/dev/null | sed -n '1,45p'
fi
