#!/usr/bin/env bash
# Installs latchkey into a root file system: binaries, systemd units and
# drop-ins, presets, the default configuration, and enables the units.
# Needs bash and coreutils only (systemctl when present; otherwise it makes
# the enablement symlinks itself). Safe to run again.
#
#   image/install.sh --root DIR [options]
#
#   --root DIR             the root file system to install into (required)
#   --bin-dir DIR          where the built latchkey-agent / latchkey-verifier
#                          are (default: <repo>/bin); build them static and
#                          stripped, as shipped:
#                            CGO_ENABLED=0 go build -trimpath -tags grpcnotrace -ldflags='-s -w' \
#                              -o bin/ ./agent/cmd/latchkey-agent ./verifier/cmd/latchkey-verifier
#   --no-binaries          install no binaries (they come another way, e.g.
#                          a mkosi ExtraTrees= entry)
#   --role ROLE            node (default): the agent, before kubelet;
#                          verifier: the verifier daemon and its socket;
#                          all: both
#   --agent-config FILE    install FILE as /etc/latchkey/agent.yaml
#                          (default: the commented template, only if the
#                          root has no agent.yaml yet)
#   --verifier-config FILE install FILE as /etc/latchkey/verifier.yaml
#   --no-enable            install, but enable nothing
#
# Layout: /usr/bin, /usr/lib/systemd/system (+ kubelet.service.d and
# containerd.service.d drop-ins), /usr/lib/systemd/system-preset,
# /etc/latchkey. See image/README.md.
set -euo pipefail
# shellcheck source=../scripts/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib/common.sh"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
UNITS=$REPO/units

ROOT=""
BIN_DIR=$REPO/bin
BINARIES=1
ROLE=node
AGENT_CONFIG=""
VERIFIER_CONFIG=""
ENABLE=1

BINDIR=/usr/bin
UNITDIR=/usr/lib/systemd/system
PRESETDIR=/usr/lib/systemd/system-preset
CONFDIR=/etc/latchkey

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

parse_args() {
  while (($#)); do
    case $1 in
      --root) ROOT=${2:?--root needs a directory}; shift ;;
      --bin-dir) BIN_DIR=${2:?--bin-dir needs a directory}; shift ;;
      --no-binaries) BINARIES=0 ;;
      --role) ROLE=${2:?--role needs node, verifier or all}; shift ;;
      --agent-config) AGENT_CONFIG=${2:?--agent-config needs a file}; shift ;;
      --verifier-config) VERIFIER_CONFIG=${2:?--verifier-config needs a file}; shift ;;
      --no-enable) ENABLE=0 ;;
      -h | --help) usage; exit 0 ;;
      *) usage >&2; exit 2 ;;
    esac
    shift
  done
  [[ -n $ROOT ]] || { usage >&2; exit 2; }
  [[ -d $ROOT ]] || die "root $ROOT is not a directory"
  ROOT=$(cd "$ROOT" && pwd)
  [[ $ROOT != / ]] || die "refusing to install into / (use a root file system directory)"
  case $ROLE in node | verifier | all) ;; *) die "unknown role $ROLE" ;; esac
}

# put SRC DST MODE: install one file, creating parent directories 0755.
put() {
  local src=$1 dst=$ROOT$2 mode=$3
  [[ -f $src ]] || die "missing $src"
  mkdir -p "$(dirname "$dst")"
  install -m "$mode" "$src" "$dst"
  echo "  $2"
}

install_binary() {
  ((BINARIES)) || return 0
  local bin=$BIN_DIR/$1
  [[ -x $bin ]] || die "$bin is missing or not executable (build it as the header says, or pass --bin-dir / --no-binaries)"
  put "$bin" "$BINDIR/$1" 0755
}

install_node() {
  install_binary latchkey-agent
  put "$UNITS/latchkey-agent.service" "$UNITDIR/latchkey-agent.service" 0644
  put "$UNITS/kubelet.service.d/50-latchkey.conf" "$UNITDIR/kubelet.service.d/50-latchkey.conf" 0644
  put "$UNITS/containerd.service.d/50-latchkey.conf" "$UNITDIR/containerd.service.d/50-latchkey.conf" 0644
  put "$UNITS/presets/50-latchkey-agent.preset" "$PRESETDIR/50-latchkey-agent.preset" 0644
  if [[ -n $AGENT_CONFIG ]]; then
    put "$AGENT_CONFIG" "$CONFDIR/agent.yaml" 0644
  elif [[ ! -e $ROOT$CONFDIR/agent.yaml ]]; then
    put "$HERE/agent.yaml" "$CONFDIR/agent.yaml" 0644
  fi
}

install_verifier() {
  install_binary latchkey-verifier
  put "$UNITS/latchkey-verifier.service" "$UNITDIR/latchkey-verifier.service" 0644
  put "$UNITS/latchkey-verifier.socket" "$UNITDIR/latchkey-verifier.socket" 0644
  put "$UNITS/presets/50-latchkey-verifier.preset" "$PRESETDIR/50-latchkey-verifier.preset" 0644
  if [[ -n $VERIFIER_CONFIG ]]; then
    put "$VERIFIER_CONFIG" "$CONFDIR/verifier.yaml" 0644
  fi
  # Where LoadCredential=latchkey-master-secret / latchkey-kubeconfig look.
  install -d -m 0700 "$ROOT/etc/credstore" "$ROOT/etc/credstore.encrypted"
}

units_to_enable() {
  case $ROLE in
    node) echo latchkey-agent.service ;;
    verifier) echo latchkey-verifier.socket latchkey-verifier.service ;;
    all) echo latchkey-agent.service latchkey-verifier.socket latchkey-verifier.service ;;
  esac
}

# enable_by_hand makes the symlinks `systemctl enable` would, from the
# units' WantedBy= lines, for builders without systemctl.
enable_by_hand() {
  local unit target
  for unit in "$@"; do
    # WantedBy= takes a space-separated list: split words on purpose.
    # shellcheck disable=SC2013
    for target in $(sed -n 's/^WantedBy=//p' "$ROOT$UNITDIR/$unit"); do
      mkdir -p "$ROOT/etc/systemd/system/$target.wants"
      ln -sfn "$UNITDIR/$unit" "$ROOT/etc/systemd/system/$target.wants/$unit"
    done
  done
}

enable_units() {
  ((ENABLE)) || return 0
  local -a units
  read -r -a units <<<"$(units_to_enable)"
  if command -v systemctl >/dev/null; then
    systemctl --root="$ROOT" --quiet enable "${units[@]}"
  else
    enable_by_hand "${units[@]}"
  fi
  echo "enabled: ${units[*]}"
}

main() {
  parse_args "$@"
  echo "installing latchkey ($ROLE) into $ROOT"
  install -d -m 0755 "$ROOT$CONFDIR"
  case $ROLE in
    node) install_node ;;
    verifier) install_verifier ;;
    all) install_node; install_verifier ;;
  esac
  enable_units
}

main "$@"
