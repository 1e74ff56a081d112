#!/usr/bin/env bash
# Checks latchkey's systemd units and image kit the way systemd and an
# image builder will meet them:
#   1. `systemd-analyze verify` on every unit in units/ (it exits 0 on
#      unknown keys and bad values, so any stderr output fails the check);
#   2. `systemd-analyze security --offline=true`: the verifier's exposure
#      must be at most 2.0 (the agent's at most 5.0, a regression guard);
#   3. image/mkosi.conf.d/latchkey/mkosi.extra is what install.sh makes;
#   4. install.sh without systemctl enables exactly what systemctl does;
#   5. a minimal Debian root (debootstrap, cached) gets image/install.sh,
#      then `systemd-analyze verify --root=DIR` on the installed units and
#      drop-ins and `systemctl --root=DIR is-enabled` for each unit;
#   6. scripts/unit-semantics.sh: a real systemd (a user manager in a
#      private mount namespace) plays boots with the real agent unit and
#      kubelet/containerd drop-ins (ordering, Requisite=, restarts, stop
#      propagation), then runs the built verifier under the real verifier
#      unit and socket (READY in the sandbox, socket activation, watchdog,
#      SIGTERM);
#   7. only with LATCHKEY_CHECK_MKOSI=1 (mkosi >= 20 on PATH, about 4
#      minutes cold): a Debian image built by mkosi with the fragment in
#      image/mkosi.conf.d/latchkey gets the same checks.
#
#   scripts/check-units.sh
#
# Env: LATCHKEY_CACHE_DIR (default <repo>/.cache; the Debian root is cached
# in its rootfs-minbase/), LATCHKEY_BIN_DIR (prebuilt binaries; default:
# go build them, or placeholders while the mains do not exist),
# LATCHKEY_DEBIAN_MIRROR, LATCHKEY_DEBIAN_SUITE (default bookworm).
# Needs root (debootstrap, unshare, a private systemd user manager);
# installs what is missing with apt-get: systemd, util-linux, procps,
# openssl, debootstrap. Ends with "N passed, N failed".
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

REPO=$(repo_root)
CACHE=$(cache_dir)
ROOTFS=$CACHE/rootfs-minbase
SUITE=${LATCHKEY_DEBIAN_SUITE:-bookworm}
MIRROR=${LATCHKEY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
ROOTFS_KEY="debootstrap --variant=minbase --include=systemd $SUITE $MIRROR"
VERIFIER_MAX=2.0
AGENT_MAX=5.0
UNITS=(latchkey-agent.service latchkey-verifier.service latchkey-verifier.socket)
REGEN_EXTRA="x=image/mkosi.conf.d/latchkey/mkosi.extra; rm -rf \$x && mkdir \$x && image/install.sh --root \$x --no-binaries"
ENABLED=(latchkey-agent.service latchkey-verifier.service latchkey-verifier.socket)

PASSED=0
FAILED=0
PLACEHOLDERS=0
WORK=$(mktemp -d "${TMPDIR:-/tmp}/check-units.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

pass() { PASSED=$((PASSED + 1)); echo "ok    $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL  $*"; }

# quiet_ok NAME CMD...: passes when CMD exits 0 and prints nothing on stderr.
quiet_ok() {
  local name=$1 err=$WORK/stderr
  shift
  if "$@" 2>"$err" >/dev/null && [[ ! -s $err ]]; then
    pass "$name"
  else
    fail "$name"
    sed 's/^/      /' "$err"
  fi
}

# binaries puts latchkey-agent and latchkey-verifier into $WORK/bin.
binaries() {
  local bin=$WORK/bin
  mkdir -p "$bin"
  if [[ -n ${LATCHKEY_BIN_DIR:-} ]]; then
    cp "$LATCHKEY_BIN_DIR"/latchkey-agent "$LATCHKEY_BIN_DIR"/latchkey-verifier "$bin"/
  elif compgen -G "$REPO/agent/cmd/latchkey-agent/*.go" >/dev/null &&
    compgen -G "$REPO/verifier/cmd/latchkey-verifier/*.go" >/dev/null; then
    (cd "$REPO" && CGO_ENABLED=0 go build -trimpath -tags grpcnotrace -ldflags='-s -w' -o "$bin"/ ./agent/cmd/latchkey-agent ./verifier/cmd/latchkey-verifier)
  else
    echo "NOTE  the mains do not exist yet: checking with placeholder executables"
    PLACEHOLDERS=1
    printf '#!/bin/sh\nexit 0\n' >"$bin/latchkey-agent"
    cp "$bin/latchkey-agent" "$bin/latchkey-verifier"
    chmod 0755 "$bin"/*
  fi
}

# 1. Every unit in units/, against the host's systemd. ExecStart= must
# exist: a private mount namespace lays the binaries over /usr/bin.
check_verify() {
  local u
  for u in "${UNITS[@]}"; do
    # shellcheck disable=SC2016 # $1..$3 belong to the inner sh
    quiet_ok "systemd-analyze verify units/$u" unshare --mount -- sh -c \
      'mount -t overlay overlay -o lowerdir="$1":/usr/bin /usr/bin && cd "$2" && systemd-analyze verify "$3"' \
      sh "$WORK/bin" "$REPO/units" "$u"
  done
}

# exposure UNITFILE prints the overall exposure systemd-analyze rates.
exposure() {
  systemd-analyze security --offline=true --no-pager "$1" 2>&1 |
    sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p'
}

check_security() {
  local unit=$1 max=$2 score
  score=$(exposure "$REPO/units/$unit")
  if [[ -z $score ]]; then
    fail "systemd-analyze security $unit: no score"
  elif awk -v s="$score" -v m="$max" 'BEGIN { exit !(s <= m) }'; then
    pass "systemd-analyze security $unit: exposure $score (max $max)"
  else
    fail "systemd-analyze security $unit: exposure $score > $max"
    systemd-analyze security --offline=true --no-pager "$REPO/units/$unit" 2>&1 | grep '✗' | sed 's/^/      /'
  fi
}

# 3. The committed mkosi.extra equals a fresh install.sh run.
check_mkosi_extra() {
  local fresh=$WORK/mkosi.extra
  mkdir -p "$fresh"
  "$REPO/image/install.sh" --root "$fresh" --no-binaries >/dev/null
  if diff -r --no-dereference "$fresh" "$REPO/image/mkosi.conf.d/latchkey/mkosi.extra" >"$WORK/diff"; then
    pass "image/mkosi.conf.d/latchkey/mkosi.extra is up to date"
  else
    fail "image/mkosi.conf.d/latchkey/mkosi.extra is stale; run: $REGEN_EXTRA"
    sed 's/^/      /' "$WORK/diff"
  fi
}

# 4. Builders without systemctl get the same enablement symlinks.
check_enable_by_hand() {
  local with=$WORK/with-systemctl without=$WORK/without-systemctl fake=$WORK/fakebin t
  mkdir -p "$with" "$without" "$fake"
  for t in bash dirname sed mkdir install ln; do ln -s "$(command -v "$t")" "$fake/$t"; done
  "$REPO/image/install.sh" --root "$with" --no-binaries --role all >/dev/null
  PATH=$fake "$REPO/image/install.sh" --root "$without" --no-binaries --role all >/dev/null
  if diff -r --no-dereference "$with/etc/systemd" "$without/etc/systemd" >"$WORK/diff"; then
    pass "install.sh enables the same units without systemctl"
  else
    fail "install.sh without systemctl enables differently"
    sed 's/^/      /' "$WORK/diff"
  fi
}

# rootfs makes (once) the cached minimal Debian root.
rootfs() {
  if [[ -f $ROOTFS/.latchkey-rootfs && $(cat "$ROOTFS/.latchkey-rootfs") == "$ROOTFS_KEY" ]]; then
    return 0
  fi
  need_packages debootstrap:debootstrap
  echo "check-units: building $ROOTFS ($ROOTFS_KEY), a few minutes"
  rm -rf "$ROOTFS" "$ROOTFS.tmp"
  mkdir -p "$CACHE"
  debootstrap --variant=minbase --include=systemd "$SUITE" "$ROOTFS.tmp" "$MIRROR" >"$CACHE/rootfs-minbase.log" 2>&1 ||
    die "debootstrap failed, see $CACHE/rootfs-minbase.log"
  echo "$ROOTFS_KEY" >"$ROOTFS.tmp/.latchkey-rootfs"
  mv "$ROOTFS.tmp" "$ROOTFS"
}

# stub_unit ROOT NAME: a stand-in for kubelet/containerd (not in Debian's
# minimal root) so their latchkey drop-ins load and get verified.
stub_unit() {
  cat >"$1/usr/lib/systemd/system/$2" <<STUB
# check-units.sh test stand-in, never shipped
[Unit]
Description=stand-in for $2

[Service]
ExecStart=/bin/true

[Install]
WantedBy=multi-user.target
STUB
}

# check_dropin_loaded ROOT UNIT proves systemd reads latchkey's drop-in for
# UNIT at its installed path (`systemctl cat` refuses --root): a probe key
# appended to it must draw a warning naming that file.
check_dropin_loaded() {
  local dropin=$1/usr/lib/systemd/system/$2.service.d/50-latchkey.conf
  cp "$dropin" "$WORK/dropin"
  echo 'LatchkeyProbe=1' >>"$dropin"
  if systemd-analyze verify --root="$1" "$2.service" 2>&1 | grep -q "$2.service.d/50-latchkey.conf:.*LatchkeyProbe"; then
    pass "$2.service loads the latchkey drop-in"
  else
    fail "$2.service does not load the latchkey drop-in"
  fi
  cp "$WORK/dropin" "$dropin"
}

# 5. install.sh into a copy of the Debian root, then verify there.
check_installed() {
  local root=$WORK/root u state
  rootfs
  cp -a "$ROOTFS" "$root"
  stub_unit "$root" kubelet.service
  stub_unit "$root" containerd.service
  if "$REPO/image/install.sh" --root "$root" --bin-dir "$WORK/bin" --role all >"$WORK/install.log" 2>&1; then
    pass "image/install.sh --root DIR --role all"
  else
    fail "image/install.sh --root DIR --role all"
    sed 's/^/      /' "$WORK/install.log"
    return
  fi
  for u in "${UNITS[@]}" kubelet.service containerd.service; do
    quiet_ok "systemd-analyze verify --root=DIR $u" systemd-analyze verify --root="$root" "$u"
  done
  for u in kubelet containerd; do check_dropin_loaded "$root" "$u"; done
  for u in "${ENABLED[@]}"; do
    state=$(systemctl --root="$root" is-enabled "$u" 2>&1 || true)
    if [[ $state == enabled ]]; then pass "systemctl --root=DIR is-enabled $u"; else fail "systemctl --root=DIR is-enabled $u: $state"; fi
  done
}

# 6. Dependency semantics under a running systemd.
check_semantics() {
  local line verifier=$WORK/bin/latchkey-verifier
  ((PLACEHOLDERS == 0)) || verifier=""
  unshare --mount --propagation private -- "$REPO/scripts/unit-semantics.sh" "$REPO" ${verifier:+"$verifier"} >"$WORK/semantics.log" 2>&1 || true
  while IFS= read -r line; do
    case $line in
      "ok    "*) pass "semantics: ${line#ok    }" ;;
      "FAIL  "*) fail "semantics: ${line#FAIL  }" ;;
    esac
  done <"$WORK/semantics.log"
  grep -q '^ok ' "$WORK/semantics.log" || { fail "semantics: unit-semantics.sh ran nothing"; sed 's/^/      /' "$WORK/semantics.log"; }
}

# 7. A real mkosi build that includes the fragment.
check_mkosi() {
  [[ ${LATCHKEY_CHECK_MKOSI:-0} == 1 ]] || return 0
  local proj=$WORK/mkosi u state version
  version=$(mkosi --version 2>/dev/null | sed -n 's/^mkosi \([0-9]*\).*/\1/p')
  if [[ -z $version || $version -lt 20 ]]; then
    fail "mkosi build: needs mkosi >= 20 (have ${version:-none}; Debian: bookworm-backports)"
    return
  fi
  mkdir -p "$proj" "$CACHE/mkosi"
  cat >"$proj/mkosi.conf" <<CONF
[Distribution]
Distribution=debian
Release=$SUITE
LocalMirror=$MIRROR

[Output]
Format=directory
CacheDirectory=$CACHE/mkosi

[Config]
Include=$REPO/image/mkosi.conf.d/latchkey

[Content]
Packages=systemd
ExtraTrees=$WORK/bin:/usr/bin
CONF
  if (cd "$proj" && mkosi -f build) >"$WORK/mkosi.log" 2>&1; then
    pass "mkosi build with image/mkosi.conf.d/latchkey"
  else
    fail "mkosi build with image/mkosi.conf.d/latchkey"
    tail -20 "$WORK/mkosi.log" | sed 's/^/      /'
    return
  fi
  quiet_ok "systemd-analyze verify --root=mkosi-image latchkey-agent.service" \
    systemd-analyze verify --root="$proj/image" latchkey-agent.service
  state=$(systemctl --root="$proj/image" is-enabled latchkey-agent.service 2>&1 || true)
  if [[ $state == enabled ]]; then pass "mkosi image: latchkey-agent.service enabled"; else fail "mkosi image: latchkey-agent.service $state"; fi
}

main() {
  [[ $(id -u) == 0 ]] || die "run as root (debootstrap, unshare)"
  need_packages systemd-analyze:systemd unshare:util-linux pgrep:procps openssl:openssl
  binaries
  check_verify
  check_security latchkey-verifier.service "$VERIFIER_MAX"
  check_security latchkey-agent.service "$AGENT_MAX"
  check_mkosi_extra
  check_enable_by_hand
  check_installed
  check_semantics
  check_mkosi
  echo "check-units: $PASSED passed, $FAILED failed"
  ((FAILED == 0))
}

main "$@"
