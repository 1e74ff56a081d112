#!/usr/bin/env bash
# A real, local Kubernetes control plane for latchkey's tests and demo.
#
#   scripts/controlplane.sh up     build/reuse the binaries, start the control
#                                  plane, print the env file's path
#   scripts/controlplane.sh env    print the env file
#   scripts/controlplane.sh down   stop everything `up` started, remove it all
#   scripts/controlplane.sh stop   stop the processes, keep the namespace and
#                                  all state (a power loss of the control plane)
#   scripts/controlplane.sh start  start them again on that state (after stop)
#
# The cluster is laid out by the real kubeadm (v1.37.2, built by
# scripts/k8s/build.sh): `kubeadm init phase certs`, `kubeconfig` (including
# super-admin), `upload-config` and `bootstrap-token`, so cluster-info, its
# RBAC and the kubeadm-config ConfigMap are those of a kubeadm cluster. etcd
# (Debian's etcd-server), kube-apiserver and kube-controller-manager (with the
# bootstrapsigner, tokencleaner and CSR signing controllers) run as plain
# processes inside a network namespace this script creates, with a /32
# address on its loopback (kubeadm refuses a loopback advertise address), so
# no traffic leaves the namespace. Run as root.
#
# Environment (all optional):
#   LATCHKEY_CP_DIR      state directory        (default /tmp/latchkey-cp)
#   LATCHKEY_CP_NETNS    network namespace      (default latchkey-cp)
#   LATCHKEY_CP_ADDR     advertise address      (default 192.0.2.10, TEST-NET-1)
#   LATCHKEY_CACHE_DIR   binary cache           (default <repo>/.cache)
#   LATCHKEY_CP_RBAC=0   do not install latchkey's RBAC (verifier/deploy)
#   LATCHKEY_CP_CONTROLLER_MANAGER_ARGS  extra kube-controller-manager flags,
#                        space-separated (e.g. "--kube-api-qps=100
#                        --kube-api-burst=200" for a boot-storm benchmark)
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
dir="${LATCHKEY_CP_DIR:-/tmp/latchkey-cp}"
ns="${LATCHKEY_CP_NETNS:-latchkey-cp}"
addr="${LATCHKEY_CP_ADDR:-192.0.2.10}"
port=6443
version=v1.37.2
envfile="$dir/env"

[[ -n "$dir" && "$dir" != / ]] || die "bad LATCHKEY_CP_DIR"

log() { printf 'controlplane: %s\n' "$*" >&2; }
inns() { ip netns exec "$ns" "$@"; }

need_tools() {
	[[ $EUID -eq 0 ]] || die "run as root (network namespaces, kubeadm)"
	command -v ip >/dev/null || die "ip (iproute2) is missing"
	command -v curl >/dev/null || die "curl is missing"
	command -v openssl >/dev/null || die "openssl is missing"
	need_packages etcd:etcd-server
	# Debian's package enables a host etcd service; this script runs its own.
	if command -v systemctl >/dev/null && systemctl is-active -q etcd 2>/dev/null; then
		log "note: the host's etcd.service is running; ours runs in $ns and does not clash"
	fi
}

# start NAME ARGS... runs a process inside the namespace, logging to
# $dir/NAME.log and recording its pid in $dir/NAME.pid.
start() {
	local name=$1; shift
	ip netns exec "$ns" setsid "$@" >"$dir/$name.log" 2>&1 </dev/null &
	echo $! >"$dir/$name.pid"
}

wait_ready() {
	local what=$1 url=$2 i
	for _ in $(seq 1 240); do
		if inns curl -sfk --max-time 2 "$url" >/dev/null 2>&1; then
			log "$what is ready"
			return 0
		fi
		sleep 0.5
	done
	die "$what did not become ready; see $dir/*.log"
}

write_kubeadm_config() {
	cat >"$dir/kubeadm.yaml" <<EOF
apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: $addr
  bindPort: $port
nodeRegistration:
  name: latchkey-cp
  criSocket: unix:///run/latchkey-cp-no-runtime.sock
  taints: []
bootstrapTokens:
# kubeadm creates one token; this one expires at once so the only usable
# tokens in this cluster are the ones latchkey mints.
- description: "controlplane.sh: expires at once, not for use"
  ttl: 1s
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: $version
clusterName: latchkey-test
controlPlaneEndpoint: $addr:$port
certificatesDir: $dir/pki
networking:
  serviceSubnet: 10.96.0.0/12
  dnsDomain: cluster.local
etcd:
  local:
    dataDir: $dir/etcd
---
# The kubelet-config ConfigMap a joining node's kubelet runs with: its
# client CA where kubeadm join puts it on the node (the default
# certificatesDir), not this host's private pki directory.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
EOF
}

# flags_of COMPONENT prints the command-line flags kubeadm's static-pod
# manifest for COMPONENT carries (the manifests are written under a private
# rootfs so the host's /etc/kubernetes is never touched).
flags_of() {
	sed -n 's/^ *- --/--/p' "$dir/root/etc/kubernetes/manifests/$1.yaml" |
		sed "s#/etc/kubernetes/\([a-z-]*\.conf\)#$dir/kube/\1#g"
}

layout() {
	local kubeadm=$1
	log "kubeadm: certs, kubeconfigs, static-pod flags"
	"$kubeadm" init phase certs all --config "$dir/kubeadm.yaml" >"$dir/kubeadm-certs.log" 2>&1
	{
		"$kubeadm" init phase kubeconfig admin --config "$dir/kubeadm.yaml" --kubeconfig-dir "$dir/kube"
		"$kubeadm" init phase kubeconfig super-admin --config "$dir/kubeadm.yaml" --kubeconfig-dir "$dir/kube"
		"$kubeadm" init phase kubeconfig controller-manager --config "$dir/kubeadm.yaml" --kubeconfig-dir "$dir/kube"
	} >>"$dir/kubeadm.log" 2>&1
	# --rootfs chroots kubeadm before it reads its config: the config goes
	# inside the private root, the manifests land in its etc/kubernetes.
	mkdir -p "$dir/root"
	cp "$dir/kubeadm.yaml" "$dir/root/kubeadm.yaml"
	{
		"$kubeadm" init phase control-plane apiserver --config /kubeadm.yaml --rootfs "$dir/root"
		"$kubeadm" init phase control-plane controller-manager --config /kubeadm.yaml --rootfs "$dir/root"
	} >>"$dir/kubeadm.log" 2>&1
	"$kubeadm" kubeconfig user --client-name latchkey-verifier --config "$dir/kubeadm.yaml" >"$dir/kube/verifier.conf" 2>>"$dir/kubeadm.log"
	chmod 0600 "$dir"/kube/*.conf
}

start_etcd() {
	local pki="$dir/pki/etcd"
	start etcd etcd --name latchkey-cp --data-dir "$dir/etcd" \
		--listen-client-urls https://127.0.0.1:2379 --advertise-client-urls https://127.0.0.1:2379 \
		--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
		--initial-cluster latchkey-cp=http://127.0.0.1:2380 \
		--cert-file "$pki/server.crt" --key-file "$pki/server.key" \
		--trusted-ca-file "$pki/ca.crt" --client-cert-auth \
		--listen-metrics-urls http://127.0.0.1:2381 --snapshot-count 10000
	wait_ready etcd http://127.0.0.1:2381/health
}

start_apiserver() {
	local bin=$1 flags
	mapfile -t flags < <(flags_of kube-apiserver)
	start kube-apiserver "$bin/kube-apiserver" "${flags[@]}"
	wait_ready kube-apiserver "https://$addr:$port/readyz"
}

start_controller_manager() {
	local bin=$1 flags
	# kubeadm's flags (bootstrapsigner, tokencleaner, CSR signing with the
	# cluster CA, service-account credentials); leader election is pointless
	# for one instance.
	local extra
	mapfile -t flags < <(flags_of kube-controller-manager | grep -v -e '^--leader-elect=')
	read -ra extra <<<"${LATCHKEY_CP_CONTROLLER_MANAGER_ARGS:-}"
	start kube-controller-manager "$bin/kube-controller-manager" "${flags[@]}" --leader-elect=false "${extra[@]}"
	wait_ready kube-controller-manager "https://127.0.0.1:10257/healthz"
}

publish() {
	local kubeadm=$1 admin="$dir/kube/super-admin.conf"
	log "kubeadm: upload-config, bootstrap-token (cluster-info and its RBAC)"
	inns "$kubeadm" init phase upload-config all --config "$dir/kubeadm.yaml" --kubeconfig "$admin" >>"$dir/kubeadm.log" 2>&1
	inns "$kubeadm" init phase bootstrap-token --config "$dir/kubeadm.yaml" --kubeconfig "$admin" --skip-token-print >>"$dir/kubeadm.log" 2>&1
	if [[ "${LATCHKEY_CP_RBAC:-1}" != 0 ]]; then
		log "installing latchkey's RBAC (verifier/deploy)"
		(cd "$repo" && go build -o "$dir/apply-rbac" ./verifier/deploy/apply-rbac)
		inns "$dir/apply-rbac" --kubeconfig "$admin" >>"$dir/kubeadm.log" 2>&1
	fi
}

ca_hash() {
	openssl x509 -in "$dir/pki/ca.crt" -noout -pubkey | openssl pkey -pubin -outform der |
		sha256sum | awk '{print "sha256:" $1}'
}

write_env() {
	local bin=$1
	cat >"$envfile" <<EOF
LATCHKEY_K8S_NETNS=$ns
LATCHKEY_K8S_ENDPOINT=$addr:$port
LATCHKEY_K8S_ADMIN_KUBECONFIG=$dir/kube/super-admin.conf
LATCHKEY_K8S_VERIFIER_KUBECONFIG=$dir/kube/verifier.conf
LATCHKEY_K8S_CA_HASH=$(ca_hash)
LATCHKEY_K8S_PKI=$dir/pki
LATCHKEY_K8S_BIN=$bin
LATCHKEY_K8S_DIR=$dir
EOF
}

# netns_exists: the namespace of this name exists (the exact name: a
# word match would take latchkey-cp-ra for latchkey-cp).
netns_exists() { ip netns list 2>/dev/null | awk '{print $1}' | grep -qxF "$ns"; }

healthy() {
	[[ -f "$envfile" ]] && netns_exists &&
		inns curl -sfk --max-time 2 "https://$addr:$port/readyz" >/dev/null 2>&1
}

up() {
	need_tools
	if healthy; then
		log "already up"
		echo "$envfile"
		return
	fi
	down quiet
	local bin
	bin="$("$repo/scripts/k8s/build.sh")"
	mkdir -p "$dir/kube"
	chmod 0700 "$dir"
	ip netns add "$ns"
	inns ip link set lo up
	inns ip addr add "$addr/32" dev lo
	write_kubeadm_config
	layout "$bin/kubeadm"
	start_etcd
	start_apiserver "$bin"
	start_controller_manager "$bin"
	publish "$bin/kubeadm"
	write_env "$bin"
	log "up: $addr:$port in network namespace $ns"
	echo "$envfile"
}

# stop_processes stops every process `up` or `start` started (their pid
# files), and nothing else.
stop_processes() {
	local f pid
	for f in "$dir"/*.pid; do
		[[ -f "$f" ]] || continue
		pid="$(cat "$f")"
		kill "$pid" 2>/dev/null || true
	done
	for f in "$dir"/*.pid; do
		[[ -f "$f" ]] || continue
		pid="$(cat "$f")"
		for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$pid" 2>/dev/null || true
		rm -f "$f"
	done
}

# cp_stop: the control plane goes down as in a power loss; its namespace,
# certificates, kubeconfigs and etcd data stay for `start`.
cp_stop() {
	[[ -f "$envfile" ]] || die "no control plane in $dir to stop"
	stop_processes
	log "stopped (state kept in $dir)"
}

# cp_start: etcd, kube-apiserver and kube-controller-manager again on the
# state `stop` kept; the cluster (CA, tokens, nodes) is the same one.
cp_start() {
	{ [[ -f "$envfile" ]] && netns_exists; } || die "no stopped control plane in $dir to start"
	local bin
	bin="$(sed -n 's/^LATCHKEY_K8S_BIN=//p' "$envfile")"
	[[ -x "$bin/kube-apiserver" ]] || die "no kube-apiserver in $bin"
	start_etcd
	start_apiserver "$bin"
	start_controller_manager "$bin"
	log "started again: $addr:$port in network namespace $ns"
	echo "$envfile"
}

down() {
	local quiet=${1:-} pid
	stop_processes
	if netns_exists; then
		# Anything still in the namespace was started inside it by us or a
		# test (a kubeadm join, say).
		for pid in $(ip netns pids "$ns"); do kill -9 "$pid" 2>/dev/null || true; done
		ip netns del "$ns"
	fi
	rm -rf "$dir"
	[[ -n "$quiet" ]] || log "down"
}

case "${1:-}" in
up) up ;;
down) down ;;
stop) cp_stop ;;
start) cp_start ;;
env) cat "$envfile" ;;
*) echo "usage: $0 up|down|stop|start|env" >&2; exit 2 ;;
esac
