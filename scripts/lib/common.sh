# shellcheck shell=bash
# Shared shell helpers of latchkey's scripts. Source it; it defines
# functions only.

# die prints "SCRIPT: MESSAGE" on stderr and exits 1.
die() {
  echo "${0##*/}: $*" >&2
  exit 1
}

# repo_root prints the repository's top directory.
repo_root() { cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd; }

# cache_dir prints the git-ignored build cache (LATCHKEY_CACHE_DIR wins).
cache_dir() { echo "${LATCHKEY_CACHE_DIR:-$(repo_root)/.cache}"; }

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
  echo "installing ${missing[*]} ..." >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
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

# swtpm_manufacture DIR: a fresh TPM state in DIR/state with an RSA and an
# ECC EK certificate signed by a throwaway local CA in DIR/ca. Prints the
# CA certificates' path (root + issuer, PEM).
swtpm_manufacture() {
  local dir=$1
  mkdir -p "$dir/state" "$dir/ca"
  cat >"$dir/swtpm-localca.conf" <<CONF
statedir = $dir/ca
signingkey = $dir/ca/signkey.pem
issuercert = $dir/ca/issuercert.pem
certserial = $dir/ca/certserial
CONF
  printf -- '--platform-manufacturer latchkey\n--platform-version 1.0\n--platform-model demo\n' >"$dir/swtpm-localca.options"
  cat >"$dir/swtpm_setup.conf" <<CONF
create_certs_tool = swtpm_localca
create_certs_tool_config = $dir/swtpm-localca.conf
create_certs_tool_options = $dir/swtpm-localca.options
active_pcr_banks = sha256
CONF
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
