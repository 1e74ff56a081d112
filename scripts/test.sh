#!/usr/bin/env bash
# The whole latchkey test suite, the README's second command:
#   1. static checks: gofmt, go vet, generated protobuf code up to date,
#      no tracked build outputs, shipped binaries free of test-only
#      packages, the agent free of verification code and the verifier of
#      device code, the layer map (scripts/layercheck), log keys only from
#      internal/logkey, Kubernetes keys only from internal/kubekey, no
#      time.Sleep in tests beyond scripts/test-sleep-allow.txt, go.mod
#      tidy (go mod tidy -diff), no product code that no program reaches
#      beyond scripts/deadcode-allow.txt (scripts/deadcode.sh), a lint of
#      every shell script (shellcheck), promtool on the monitoring rules;
#   2. go test ./... : unit tests and the swtpm / cryptsetup integration
#      tests (needs root for loop devices), plus a short fuzz run;
#   3. systemd units and the image kit (systemd-analyze, debootstrap root);
#   4. the real Kubernetes control plane tier (kube-apiserver, etcd,
#      kube-controller-manager, kubeadm built from k8s.io/kubernetes);
#   5. the QEMU guest boots: a measured guest (OVMF, UKI, dm-verity root,
#      swtpm TPM) and its dm-crypt state disk: reboot, real tampering,
#      upgrade, crash; a real kubelet (on containerd 2, both built from
#      their Go modules) joins and turns Ready, a hostile one is denied.
# Tiers 3-5 cache their builds under .cache/ (or $LATCHKEY_CACHE_DIR).
#
#   scripts/test.sh            everything
#   scripts/test.sh --quick    tiers 1 and 2 only
#   scripts/test.sh --static   tier 1 only
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "$0")/lib/common.sh"
cd "$(repo_root)"
quick=false static=false
[[ ${1:-} == --quick ]] && quick=true
[[ ${1:-} == --static ]] && static=true

need_go
need_packages swtpm:swtpm swtpm_setup:swtpm-tools tpm2_pcrextend:tpm2-tools cryptsetup:cryptsetup-bin \
  protoc:protobuf-compiler mkfs.xfs:xfsprogs pvcreate:lvm2 sgdisk:gdisk mkfs.ext4:e2fsprogs \
  blkid:util-linux python3:python3 shellcheck:shellcheck objcopy:binutils osslsigncode:osslsigncode \
  /usr/lib/systemd/boot/efi/linuxx64.efi.stub:systemd-boot-efi mkfs.btrfs:btrfs-progs mkfs.vfat:dosfstools \
  xorriso:xorriso sfdisk:fdisk mdadm:mdadm promtool:prometheus make-bcache:bcache-tools mcopy:mtools

declare -A took=()
tier() {
  local name=$1 start=$SECONDS
  shift
  printf '\n\033[1m== %s\033[0m\n' "$name"
  "$@"
  took[$name]=$((SECONDS - start))
}

static_checks() {
  local unformatted gofiles
  mapfile -t gofiles < <(git ls-files '*.go' | grep -v '^proto/')
  unformatted=$(gofmt -l "${gofiles[@]}" 2>/dev/null || true)
  if [[ -n $unformatted ]]; then
    echo "gofmt: these files need formatting:" >&2
    echo "$unformatted" >&2
    return 1
  fi
  go vet ./...
  # The tagged tiers compile too (their tests run in the Kubernetes and QEMU tiers).
  go vet -tags k8s ./...
  go vet -tags vm ./...
  # go.mod and go.sum as go mod tidy leaves them (direct requires not marked
  # indirect, nothing missing or unused); it reads the test dependencies'
  # go.mod files, which go test ./... downloads anyway.
  go mod tidy -diff
  go -C scripts/tools mod tidy -diff
  scripts/gen-proto.sh --check
  no_build_outputs
  no_issue_numbers
  shipped_test_only
  agent_links_only_allowed
  verifier_links_no_device_code
  # The layer map: internal/ imports nothing of the product, attest/ neither
  # agent/ nor verifier/, agent/ and verifier/ not each other, and each
  # variant's issuer and validator not each other (nor the other side's binary).
  go test -count=1 ./scripts/layercheck
  # One log vocabulary: every log key in the product is an internal/logkey constant.
  go test -count=1 -run '^(TestKeysAreConstants|TestScannerFindsEveryKeyForm|TestOneNamePerConcept)$' ./internal/logkey
  # One Kubernetes vocabulary: every latchkey.io/ label, annotation and taint key is an internal/kubekey constant.
  go test -count=1 -run '^(TestKeysLiveHere|TestScannerFindsEveryLiteral|TestOneKeyPerConcept)$' ./internal/kubekey
  # No new fixed sleeps in tests: time.Sleep per test file within scripts/test-sleep-allow.txt.
  go test -count=1 ./scripts/sleepcheck
  # No product code that no program reaches (test-only code lives in tests).
  scripts/deadcode.sh
  shell_lint
  monitoring_rules
  echo "static checks passed"
}

# no_build_outputs fails when the tree tracks an ELF file anywhere or a
# file over 1 MiB outside a testdata directory: build outputs and caches
# never belong in the repository (a stray `go build` once committed a
# 33 MB agent binary).
no_build_outputs() {
  local bad=() f size
  while IFS= read -r -d '' f; do
    [[ -f $f && ! -L $f ]] || continue
    if [[ $(head -c4 "$f" | od -An -tx1 | tr -d ' \n') == 7f454c46 ]]; then
      bad+=("$f (ELF)")
      continue
    fi
    size=$(stat -c %s "$f")
    if ((size > 1048576)) && [[ $f != testdata/* && $f != */testdata/* ]]; then
      bad+=("$f ($size bytes)")
    fi
  done < <(git ls-files -z)
  if ((${#bad[@]})); then
    printf 'build outputs or large files are tracked (remove them; .gitignore covers build outputs):\n' >&2
    printf '  %s\n' "${bad[@]}" >&2
    return 1
  fi
}

# no_issue_numbers fails when a tracked file cites a tracker issue by
# number: the tracker is not part of the repository, so such a reference
# means nothing to a reader (history belongs in commit messages).
no_issue_numbers() {
  local hits
  hits=$(git grep -n -i -E '\bissues? #?[0-9]+' || true)
  if [[ -n $hits ]]; then
    echo "issue numbers in the tree (say what the thing is instead):" >&2
    echo "$hits" >&2
    return 1
  fi
}

# shell_lint runs shellcheck (settings in .shellcheckrc) on every tracked
# shell script: the *.sh files and every file whose first line is a sh or
# bash shebang (.ci/run, the QEMU guest's scripts).
# monitoring_rules checks the shipped Prometheus rules and runs their unit
# tests (verifier/deploy, docs/metrics.md).
monitoring_rules() {
  (cd verifier/deploy && promtool check rules prometheus-rules.yaml && promtool test rules prometheus-rules.test.yaml)
}

shell_lint() {
  local scripts=() f
  while IFS= read -r f; do
    [[ -f $f && ! -L $f ]] || continue
    if [[ $f == *.sh ]] || head -n1 "$f" | grep -qE '^#! */?[^ ]*(/| )(ba)?sh( |$)'; then
      scripts+=("$f")
    fi
  done < <(git ls-files)
  shellcheck "${scripts[@]}"
}

# shipped_test_only fails when either shipped binary links a test-only
# package: Go's testing, the test helpers of latchkey (the *test packages,
# internal/pkitest and internal/logtest among them), go-sev-guest's and
# go-tdx-guest's testing packages,
# any .../fake package (a fake clientset's init would run at start), or
# k8s.io/client-go/testing. client-go's generic typed client
# (k8s.io/client-go/gentype) keeps its fake in the same package and so
# imports client-go/testing into every program that uses typed clients
# (kubernetes/kubernetes#137782); that one import is allowed, and any
# other importer of client-go/testing fails.
shipped_test_only() {
  local bins=(./agent/cmd/latchkey-agent ./verifier/cmd/latchkey-verifier) bad importers
  bad=$(go list -deps "${bins[@]}" |
    grep -E '^testing$|go-sev-guest/testing|go-tdx-guest/testing|tpmtest|snptest|tdxtest|attesttest|localapitest|predicttest|k8stest|etcdtest|benchtest|yamltest|pkitest|uefitest|logtest|sdnotifytest|clitest|gosrctest|execxtest|policytest|/fake(/|$)' || true)
  importers=$(go list -deps -f '{{.ImportPath}} {{join .Imports " "}}' "${bins[@]}" |
    awk '$1 != "k8s.io/client-go/gentype" { for (i = 2; i <= NF; i++) if ($i == "k8s.io/client-go/testing") print $1 }')
  if [[ -n $bad || -n $importers ]]; then
    [[ -z $bad ]] || echo "shipped binaries link test-only packages: ${bad//$'\n'/ }" >&2
    [[ -z $importers ]] || echo "k8s.io/client-go/testing is imported by: ${importers//$'\n'/ }" >&2
    return 1
  fi
}

# AGENT_MODULES are the modules the agent may link. Every package linked
# runs its initialisers at each boot, before the first TPM command, so a
# new module here is a start-up cost to be argued for: the Kubernetes
# join renders kubeadm's files with the agent's own wire structs
# (agent/join/wire.go) precisely to keep client-go, apimachinery and
# kubeadm's API types out, and writes them with internal/strictyaml
# rather than sigs.k8s.io/yaml, whose yaml v2 compiles regexps at start.
# sigs.k8s.io/json (strictyaml's case-sensitive decoder) is a fork of
# encoding/json, not a Kubernetes API package.
AGENT_MODULES=(
  github.com/latchkey/latchkey
  github.com/anatol/devmapper.go github.com/anatol/luks.go
  github.com/coreos/go-systemd/v22
  github.com/dgryski/go-camellia github.com/jzelinskie/whirlpool
  github.com/google/go-configfs-tsm github.com/google/go-eventlog
  github.com/google/go-sev-guest github.com/google/go-tdx-guest github.com/google/logger
  github.com/google/go-tpm github.com/google/uuid
  go.uber.org/multierr go.yaml.in/yaml/v3
  golang.org/x/crypto golang.org/x/net golang.org/x/sys golang.org/x/text
  google.golang.org/genproto/googleapis/rpc google.golang.org/grpc google.golang.org/protobuf
  sigs.k8s.io/json
)

# agent_links_only_allowed fails when the agent, built as it ships (the
# grpcnotrace tag: image/README.md), links a module outside AGENT_MODULES,
# any k8s.io/ package (client-go, apimachinery, kubeadm,
# cluster-bootstrap, klog: each of them initialises API schemes, flag sets
# or regexps at start), gRPC's tracing and the templates it brings, or
# verification code: an evidence variant's validator (attest/<variant>;
# the agent's half is attest/<variant>/issuer, scripts/layercheck; atls,
# attesttest and uefilog under attest/ are shared, no variant) or
# go-sev-guest's verify, validate, kds and check packages (the KDS
# certificate profile, the AMD roots and their parsing: the issuer needs
# only go-sev-guest's client and abi).
agent_links_only_allowed() {
  local deps extra banned
  deps=$(go list -tags grpcnotrace -deps -f '{{.ImportPath}} {{with .Module}}{{.Path}}{{end}}' ./agent/cmd/latchkey-agent)
  extra=$(awk -v allowed="${AGENT_MODULES[*]}" 'BEGIN { n = split(allowed, a, " "); for (i = 1; i <= n; i++) ok[a[i]] = 1 }
    NF == 2 && !($2 in ok) { print $2 }' <<<"$deps" | sort -u)
  banned=$(awk '$1 ~ /^k8s\.io\// || $1 == "golang.org/x/net/trace" || $1 ~ /^(html|text)\/template$/ ||
    $1 ~ /^github\.com\/google\/go-sev-guest\/(verify|validate|kds|proto\/check)(\/|$)/ ||
    ($1 ~ /^github\.com\/latchkey\/latchkey\/attest\/[^\/]+$/ && $1 !~ /\/attest\/(atls|attesttest|uefilog)$/) { print $1 }' <<<"$deps")
  if [[ -n $extra || -n $banned ]]; then
    [[ -z $extra ]] || echo "the agent links modules outside AGENT_MODULES (scripts/test.sh): ${extra//$'\n'/ }" >&2
    [[ -z $banned ]] || echo "the agent links packages it must not: ${banned//$'\n'/ }" >&2
    return 1
  fi
}

# verifier_links_no_device_code fails when the verifier links code that
# reaches an evidence device: go-tpm's Linux TPM transport, go-sev-guest's
# guest client and the configfs-tsm report interface beneath it, or an
# evidence variant's issuer (attest/<variant>/issuer, which opens the TPM
# or asks the AMD secure processor). The verifier only judges evidence.
verifier_links_no_device_code() {
  local bad
  bad=$(go list -deps ./verifier/cmd/latchkey-verifier |
    grep -E '^github\.com/google/go-tpm/tpm2/transport/linuxtpm$|^github\.com/google/go-sev-guest/client(/|$)|^github\.com/google/go-configfs-tsm/|^github\.com/latchkey/latchkey/attest/[^/]+/issuer(/|$)' || true)
  if [[ -n $bad ]]; then
    echo "the verifier links evidence device code: ${bad//$'\n'/ }" >&2
    return 1
  fi
}

unit_and_integration() {
  go test -count=1 -timeout 20m ./...
  # A short run of each fuzz target keeps the decoders honest. The runs
  # are bounded by a count of inputs, not a duration: Go 1.26's fuzzing
  # coordinator can fail a target with a bare "context deadline exceeded"
  # when a -fuzztime duration ends (golang/go#75804, fixed in Go 1.27),
  # and a count has no deadline. Each count is about the duration it
  # replaced (20, 10, 20 and 30 s) on a 2-core machine.
  go test -run '^$' -fuzz '^FuzzDecodeEvidence$' -fuzztime 120000x -fuzzminimizetime 2s ./attest/snp
  go test -run '^$' -fuzz '^FuzzDecode$' -fuzztime 50000x -fuzzminimizetime 2s ./attest/tdx
  go test -run '^$' -fuzz '^FuzzVerifyBoot$' -fuzztime 30000x -fuzzminimizetime 2s ./attest/tpm
  # Replay-preserving edits of every event-log corpus: refused or no change.
  go test -run '^$' -fuzz '^FuzzEventLogEdits$' -fuzztime 40000x -fuzzminimizetime 5s ./attest/tpm
}

tier "static checks" static_checks
$static || tier "go test ./... (unit, swtpm, cryptsetup)" unit_and_integration
if ! $quick && ! $static; then
  tier "systemd units and image kit" scripts/check-units.sh
  tier "kubernetes control plane" scripts/test-k8s.sh
  tier "qemu guest boots (a real kubelet joins in the guest)" env LATCHKEY_E2E_JOIN=kubeadm scripts/e2e-vm.sh --phase2
fi

printf '\n\033[1m== summary\033[0m\n'
for k in "${!took[@]}"; do printf '   %-45s %5ss\n' "$k" "${took[$k]}"; done
echo "all tiers passed"
