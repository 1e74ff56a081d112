# shellcheck shell=bash
# Shared shell helpers of latchkey's scripts. Source it; it defines
# functions only.

# note prints a progress line on stderr: through the script's own log()
# when it defines one (timestamped, prefixed), else as "SCRIPT: MESSAGE".
note() {
  if declare -F log >/dev/null; then
    log "$*"
  else
    echo "${0##*/}: $*" >&2
  fi
}

# die prints MESSAGE like note (with "ERROR: " when through log()) and
# exits 1.
die() {
  if declare -F log >/dev/null; then
    log "ERROR: $*"
  else
    echo "${0##*/}: $*" >&2
  fi
  exit 1
}

# repo_root prints the repository's top directory.
repo_root() { cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd; }

# cache_dir prints the git-ignored build cache (LATCHKEY_CACHE_DIR wins).
cache_dir() { echo "${LATCHKEY_CACHE_DIR:-$(repo_root)/.cache}"; }

# apt_install PKG...: installs the Debian packages that are not installed,
# waiting for a dpkg lock another apt run holds instead of failing. Needs
# root.
apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  [[ $(id -u) == 0 ]] || die "missing packages: ${missing[*]} (run as root, or apt-get install them)"
  note "installing host packages: ${missing[*]}"
  apt_update_once
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -q \
    --no-install-recommends "${missing[@]}" >&2 || die "apt-get install ${missing[*]} failed"
}

APT_UPDATED=0
# apt_update_once refreshes the package index once per run.
apt_update_once() {
  ((APT_UPDATED)) && return 0
  apt-get -o DPkg::Lock::Timeout=900 update -q >&2 || die "apt-get update failed"
  APT_UPDATED=1
}

# need_packages installs the Debian packages whose commands are missing.
# Arguments are command:package pairs.
need_packages() {
  local missing=() pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
  done
  ((${#missing[@]} == 0)) && return 0
  if [[ $(id -u) != 0 ]]; then
    echo "missing packages: ${missing[*]} (run as root, or apt-get install them)" >&2
    return 1
  fi
  (apt_install "${missing[@]}") >/dev/null
}

# need_go checks for a Go toolchain new enough for go.mod.
need_go() {
  export PATH="$PATH:/usr/local/go/bin"
  if ! command -v go >/dev/null; then
    echo "Go is not installed: install Go 1.26 or newer (https://go.dev/dl) into /usr/local/go" >&2
    return 1
  fi
}

# free_port prints a free TCP port on 127.0.0.1.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
    echo $((20000 + RANDOM % 20000))
}

# swtpm_ca_config CONFDIR CADIR MANUFACTURER VERSION MODEL: the
# configuration of a throwaway local CA (state in CADIR) that swtpm_setup
# uses to sign EK and platform certificates, written into CONFDIR. Prints
# the swtpm_setup.conf path. Every TPM manufactured with it shares the CA.
swtpm_ca_config() {
  local conf=$1 ca=$2
  mkdir -p "$conf" "$ca"
  cat >"$conf/swtpm-localca.conf" <<CONF
statedir = $ca
signingkey = $ca/signkey.pem
issuercert = $ca/issuercert.pem
certserial = $ca/certserial
CONF
  printf -- '--platform-manufacturer %s\n--platform-version %s\n--platform-model %s\n' "$3" "$4" "$5" \
    >"$conf/swtpm-localca.options"
  cat >"$conf/swtpm_setup.conf" <<CONF
create_certs_tool = $(command -v swtpm_localca || echo swtpm_localca)
create_certs_tool_config = $conf/swtpm-localca.conf
create_certs_tool_options = $conf/swtpm-localca.options
active_pcr_banks = sha256
CONF
  echo "$conf/swtpm_setup.conf"
}

# swtpm_manufacture DIR: a fresh TPM state in DIR/state with an RSA and an
# ECC EK certificate signed by a throwaway local CA in DIR/ca. Prints the
# CA certificates' path (root + issuer, PEM).
swtpm_manufacture() {
  local dir=$1
  mkdir -p "$dir/state"
  swtpm_ca_config "$dir" "$dir/ca" latchkey 1.0 demo >/dev/null
  XDG_CONFIG_HOME=$dir HOME=$dir swtpm_setup --tpm2 --tpmstate "$dir/state" --config "$dir/swtpm_setup.conf" \
    --create-ek-cert --create-platform-cert --pcr-banks sha256 --overwrite >"$dir/swtpm_setup.log" 2>&1 ||
    { cat "$dir/swtpm_setup.log" >&2; return 1; }
  cat "$dir/ca/swtpm-localca-rootca-cert.pem" "$dir/ca/issuercert.pem" >"$dir/ek-ca.pem"
  echo "$dir/ek-ca.pem"
}

# swtpm_start DIR PORT: serves DIR/state's TPM on 127.0.0.1:PORT (control
# channel on PORT+1), in the background; writes DIR/swtpm.pid.
swtpm_start() {
  local dir=$1 port=$2
  swtpm socket --tpm2 --tpmstate "dir=$dir/state" \
    --server "type=tcp,port=$port,bindaddr=127.0.0.1" --ctrl "type=tcp,port=$((port + 1)),bindaddr=127.0.0.1" \
    --flags startup-clear --pid "file=$dir/swtpm.pid" --log "file=$dir/swtpm.log" --daemon
}

# wait_port PORT [SECONDS]: waits for a listener on 127.0.0.1:PORT.
wait_port() {
  local i
  for ((i = 0; i < ${2:-20} * 10; i++)); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on 127.0.0.1:$1" >&2
  return 1
}
