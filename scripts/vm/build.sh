# shellcheck shell=bash
# Guest image builder for scripts/e2e-vm.sh (sourced, not executed).
#
# Everything comes from Debian packages: the cloud kernel (unpacked with
# dpkg-deb, never installed on the host), a debootstrap minbase root file
# system, and an initrd whose only program is latchkey-vmguest (a static Go
# init, scripts/vm/vmguest). Every artefact is cached under
# $VM_CACHE/<name>-<key>, where the key hashes the artefact's inputs, and is
# built in a temporary folder that is renamed into place only on success,
# so an interrupted build never leaves a half artefact that looks done.
#
# Callers set REPO (the repository root) and VM_CACHE before sourcing.

VM_SUITE=${LATCHKEY_VM_SUITE:-bookworm}
VM_MIRROR=${LATCHKEY_VM_MIRROR:-http://deb.debian.org/debian}
VM_KERNEL_META=linux-image-cloud-amd64
# The guest's Debian packages. cryptsetup-bin for luksFormat/open, kmod so
# the kernel can load dm-crypt on demand, iproute2 for debugging the link;
# runc and containernetworking-plugins (bridge, host-local, loopback in
# /usr/lib/cni) for the real kubelet's containerd (phase 2, kubeadm mode;
# one root file system serves every guest, so one debootstrap).
VM_ROOTFS_PACKAGES=systemd,systemd-sysv,udev,cryptsetup-bin,e2fsprogs,kmod,iproute2,libtss2-esys-3.0.2-0,libtss2-mu0,libtss2-rc0,runc,containernetworking-plugins
# The initrd's modules: just enough to see the virtio disks and to map the
# dm-verity root; their dependencies come from modprobe --show-depends, in
# load order.
VM_INITRD_MODULES=(virtio_pci virtio_blk dm-verity)
# Host tools the builder and the boot harness need, by Debian package:
# QEMU and OVMF (UEFI firmware), swtpm, and image/build-measured.sh's
# tools (systemd-stub, objcopy, FAT and GPT tools, veritysetup, xxd); curl
# reads the e2e verifier's metrics.
VM_HOST_PACKAGES=(qemu-system-x86 ovmf swtpm swtpm-tools gnutls-bin debootstrap socat cpio e2fsprogs kmod
  systemd-boot-efi binutils dosfstools mtools gdisk cryptsetup-bin xxd python3 curl)
VM_ROOT_SIZE=${LATCHKEY_VM_ROOT_SIZE:-1536M}

log() { printf '%s e2e-vm: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# safe_rm DIR: removes a build folder, first unmounting anything a killed
# debootstrap left mounted below it (proc, sys, a bind-mounted /dev), and
# never crossing into another file system.
safe_rm() {
  local dir m
  [[ -e $1 ]] || return 0
  dir=$(realpath "$1")
  while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done < <(awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r)
  rm -rf --one-file-system "$dir"
}

# prune_except KEEP PATH...: removes the cached artefacts PATH... other
# than KEEP, so superseded images (every code change makes one) do not
# pile up in the cache.
prune_except() {
  local keep=$1 p
  shift
  for p in "$@"; do
    [[ -e $p && $p != "$keep" ]] && rm -f "$p"
  done
  return 0
}

# sha256 of its arguments and stdin, shortened for folder names.
key_of() { { printf '%s\n' "$@"; cat; } | sha256sum | cut -c1-16; }

# tree_hash DIR...: a hash over the paths, modes and contents of the files
# below each DIR, so an edited guest file rebuilds the image.
tree_hash() {
  local d
  for d in "$@"; do
    (cd "$d" && find . -type f -printf '%p %m\n' | LC_ALL=C sort &&
      find . -type f -print0 | LC_ALL=C sort -z | xargs -0r sha256sum)
  done | sha256sum | cut -c1-16
}

ensure_host_tools() {
  [[ $(id -u) == 0 ]] || die "run as root: debootstrap, mkfs.ext4 -d with device nodes and apt-get need it"
  apt_install "${VM_HOST_PACKAGES[@]}"
  command -v go >/dev/null || die "go not found in PATH"
}

# kernel_package [older] prints the versioned kernel package the meta
# package points at (e.g. linux-image-6.1.0-57-cloud-amd64) and its
# version; with "older", the one an older version of the meta package in
# the apt index points at (bookworm's point release next to the security
# update): the measured guest's "other kernel".
kernel_package() {
  local pkg ver meta=$VM_KERNEL_META
  if [[ ${1:-} == older ]]; then
    [[ -n $(apt-cache madison "$VM_KERNEL_META" 2>/dev/null) ]] || apt_update_once
    ver=$(apt-cache madison "$VM_KERNEL_META" | awk '{print $3}' | sort -u -V | head -n 1)
    [[ -n $ver && $ver != "$(apt-cache madison "$VM_KERNEL_META" | awk '{print $3}' | sort -u -V | tail -n 1)" ]] ||
      die "the measured guest needs two versions of $VM_KERNEL_META in the apt index (a point release and a security update)"
    meta="$VM_KERNEL_META=$ver"
    pkg=$(apt-cache show "$meta" | awk -F'[ ,]+' '/^Depends:/ {for (i = 2; i <= NF; i++) if ($i ~ /^linux-image-/) {print $i; exit}}')
  else
    pkg=$(apt-cache depends "$meta" 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')
    if [[ -z $pkg ]]; then
      apt_update_once
      pkg=$(apt-cache depends "$meta" | awk '/Depends: linux-image-/ {print $2; exit}')
    fi
  fi
  [[ -n $pkg ]] || die "cannot resolve $meta"
  ver=$(apt-cache show --no-all-versions "$pkg" | awk '/^Version:/ {print $2; exit}')
  printf '%s %s\n' "$pkg" "$ver"
}

# build_kernel [older] sets KERNEL_DIR (vmlinuz, lib/modules/KVER) and KVER.
build_kernel() {
  local pkg ver tmp
  read -r pkg ver < <(kernel_package "${1:-}")
  KERNEL_DIR=$VM_CACHE/kernel-${pkg#linux-image-}-$ver
  if [[ ! -f $KERNEL_DIR/.done ]]; then
    log "kernel: fetching $pkg $ver"
    tmp=$(mktemp -d "$VM_CACHE/.kernel.XXXXXX")
    if ! (cd "$tmp" && apt-get -o APT::Sandbox::User=root download "$pkg=$ver" >&2); then
      apt_update_once
      (cd "$tmp" && apt-get -o APT::Sandbox::User=root download "$pkg=$ver" >&2) || die "apt-get download $pkg failed"
    fi
    dpkg-deb -x "$tmp"/*.deb "$tmp/x"
    mkdir -p "$tmp/out"
    mv "$tmp"/x/boot/vmlinuz-* "$tmp/out/vmlinuz"
    mv "$tmp/x/lib" "$tmp/out/lib"
    depmod -b "$tmp/out" "$(basename "$tmp"/out/lib/modules/*)"
    touch "$tmp/out/.done"
    safe_rm "$KERNEL_DIR"
    mv "$tmp/out" "$KERNEL_DIR"
    safe_rm "$tmp"
  fi
  KVER=$(basename "$KERNEL_DIR"/lib/modules/*)
}

# build_rootfs sets ROOTFS_DIR to a cached debootstrap minbase tree.
build_rootfs() {
  local key tmp t0
  key=$(key_of "$VM_SUITE" "$VM_MIRROR" "$VM_ROOTFS_PACKAGES" rootfs-v1 </dev/null)
  ROOTFS_DIR=$VM_CACHE/rootfs-$VM_SUITE-$key
  [[ -f $ROOTFS_DIR/.done ]] && return 0
  log "rootfs: debootstrap $VM_SUITE minbase (a few minutes, cached afterwards)"
  t0=$SECONDS
  for tmp in "$VM_CACHE"/.rootfs.*; do safe_rm "$tmp"; done
  tmp=$(mktemp -d "$VM_CACHE/.rootfs.XXXXXX")
  debootstrap --variant=minbase --include="$VM_ROOTFS_PACKAGES" \
    "$VM_SUITE" "$tmp/root" "$VM_MIRROR" >"$tmp/debootstrap.log" 2>&1 ||
    { tail -20 "$tmp/debootstrap.log" >&2; die "debootstrap failed (log: $tmp/debootstrap.log)"; }
  rm -f "$tmp"/root/var/cache/apt/archives/*.deb "$tmp"/root/var/lib/apt/lists/*_Packages
  touch "$tmp/.done"
  safe_rm "$ROOTFS_DIR"
  mv "$tmp" "$ROOTFS_DIR"
  log "rootfs: built in $((SECONDS - t0)) s"
}

# build_vmguest sets VMGUEST_BIN to the static guest helper, cached by the
# hash of its sources and the Go version.
build_vmguest() {
  local key
  key=$( (go version; tree_hash "$REPO/scripts/vm/vmguest"; cat "$REPO/go.sum") | key_of vmguest)
  VMGUEST_BIN=$VM_CACHE/vmguest-$key/latchkey-vmguest
  [[ -x $VMGUEST_BIN ]] && return 0
  mkdir -p "${VMGUEST_BIN%/*}"
  (cd "$REPO" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' \
    -o "$VMGUEST_BIN.tmp" ./scripts/vm/vmguest) || die "build latchkey-vmguest failed"
  mv "$VMGUEST_BIN.tmp" "$VMGUEST_BIN"
}

# build_initrd [KERNEL_DIR KVER] sets INITRD to a gzip'ed newc cpio
# holding the static init and the modules of VM_INITRD_MODULES with their
# dependencies, for that kernel (default: KERNEL_DIR, KVER). Needs
# VMGUEST_BIN. Files are stamped with one date, so the same inputs make
# the same bytes (the UKI's digest, and so PCR 4 and 11, depend on them).
build_initrd() {
  local kdir=${1:-$KERNEL_DIR} kver=${2:-$KVER} key tmp m f
  key=$(sha256sum "$VMGUEST_BIN" | key_of "$kver" "${VM_INITRD_MODULES[*]}" initrd-v2)
  INITRD=$VM_CACHE/initrd-$key.cpio.gz
  [[ -f $INITRD ]] && return 0
  tmp=$(mktemp -d "$VM_CACHE/.initrd.XXXXXX")
  mkdir -p "$tmp/root"/{dev,proc,sys,etc,newroot,modules}
  mknod -m 600 "$tmp/root/dev/console" c 5 1
  cp "$VMGUEST_BIN" "$tmp/root/init"
  while read -r f; do
    m=$(basename "$f")
    [[ -e $tmp/root/modules/$m ]] && continue
    cp "$f" "$tmp/root/modules/"
    echo "/modules/$m" >>"$tmp/root/etc/modules.load"
  done < <(for m in "${VM_INITRD_MODULES[@]}"; do
    modprobe --show-depends -d "$kdir" -S "$kver" "$m" || die "initrd: module $m not found in $kver"
  done | awk '$1 == "insmod" {print $2}')
  find "$tmp/root" -exec touch -h -d @0 {} +
  (cd "$tmp/root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0 --reproducible | gzip -1 -n >"$tmp/initrd")
  mv "$tmp/initrd" "$INITRD"
  safe_rm "$tmp"
}

# guest_common_setup DIR: what every harness guest needs on top of the
# debootstrap tree: kernel modules, the vmguest helper, a static network on
# QEMU's user network, and no units that only slow a test boot down.
guest_common_setup() {
  local root=$1 k
  mkdir -p "$root/lib/modules"
  for k in "${GUEST_KERNELS[@]:-$KERNEL_DIR}"; do
    cp -a "$k"/lib/modules/* "$root/lib/modules/"
  done
  install -m 0755 "$VMGUEST_BIN" "$root/usr/local/sbin/latchkey-vmguest"
  cp -a "$REPO/scripts/vm/guest/common/." "$root/"
  echo latchkey-e2e >"$root/etc/hostname"
  # A fixed machine-id keeps boots of one image comparable.
  echo 4c61746368b0e2e0c0ffee0000000001 >"$root/etc/machine-id"
  printf '/dev/vda / ext4 rw,errors=remount-ro 0 1\n' >"$root/etc/fstab" # build-measured.sh rewrites it
  systemctl --root="$root" enable systemd-networkd.service systemd-networkd-wait-online.service >/dev/null 2>&1 ||
    die "enable systemd-networkd in guest failed"
  systemctl --root="$root" mask getty@tty1.service serial-getty@ttyS0.service getty-static.service \
    apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer \
    systemd-timesyncd.service >/dev/null 2>&1 || true
  systemctl --root="$root" enable latchkey-e2e-tamper.service >/dev/null 2>&1 ||
    die "enable latchkey-e2e-tamper.service failed"
}

# build_image NAME HOOK [INPUT_KEY]: sets IMAGE to a cached ext4 root image
# made from the debootstrap tree, guest_common_setup, and HOOK DIR (a shell
# function that adds the scenario's files). INPUT_KEY must change whenever
# what HOOK installs changes.
build_image() {
  local name=$1 hook=$2 input_key=${3:-} key tmp t0
  key=$(key_of "$ROOTFS_DIR" "$KVER" "${GUEST_KERNELS[*]:-}" "$VMGUEST_BIN" "$input_key" "$VM_ROOT_SIZE" \
    "$(tree_hash "$REPO/scripts/vm/guest")" "$(declare -f guest_common_setup "$hook")" </dev/null)
  IMAGE=$VM_CACHE/image-$name-$key.ext4
  [[ -f $IMAGE ]] && return 0
  t0=$SECONDS
  tmp=$(mktemp -d "$VM_CACHE/.image.XXXXXX")
  cp -a "$ROOTFS_DIR/root" "$tmp/root"
  guest_common_setup "$tmp/root"
  "$hook" "$tmp/root"
  mkfs.ext4 -q -F -L latchkey-root -d "$tmp/root" "$tmp/image.ext4" "$VM_ROOT_SIZE" >/dev/null ||
    die "mkfs.ext4 -d failed"
  mv "$tmp/image.ext4" "$IMAGE"
  safe_rm "$tmp"
  prune_except "$IMAGE" "$VM_CACHE"/image-"$name"-*.ext4
  log "image $name: built in $((SECONDS - t0)) s"
}

# build_base sets KERNEL_DIR, KVER, ROOTFS_DIR, VMGUEST_BIN and INITRD.
build_base() {
  mkdir -p "$VM_CACHE"
  build_kernel
  build_rootfs
  build_vmguest
  build_initrd
}

# ---------------------------------------------------------------- measured

# The measured guest boots two kernels: v1 is the image as first released
# (the older Debian kernel in the apt index), v2 its upgrade (the current
# one). Both kernels' modules are in the one verified root; each UKI
# carries its own initrd.
# OVMF's 4 MiB build without Secure Boot keys (run.sh: the code read-only,
# a copy of the variable store per node).
# shellcheck disable=SC2034 # used by run.sh
OVMF_CODE=/usr/share/OVMF/OVMF_CODE_4M.fd
# shellcheck disable=SC2034 # used by run.sh
OVMF_VARS=/usr/share/OVMF/OVMF_VARS_4M.fd
MEASURED_KIT=image/build-measured.sh

# build_measured_base sets KERNEL1_DIR, KVER1, INITRD1 (v1) next to
# KERNEL_DIR, KVER, INITRD (v2) and GUEST_KERNELS. Needs build_base.
build_measured_base() {
  local k2=$KERNEL_DIR v2=$KVER i2=$INITRD
  build_kernel older
  KERNEL1_DIR=$KERNEL_DIR KVER1=$KVER
  build_initrd "$KERNEL1_DIR" "$KVER1"
  INITRD1=$INITRD
  KERNEL_DIR=$k2 KVER=$v2 INITRD=$i2
  GUEST_KERNELS=("$KERNEL1_DIR" "$KERNEL_DIR")
}

# build_measured NAME HOOK INPUT_KEY CMDLINE: sets MEASURED to a cached
# folder holding image/build-measured.sh's outputs for one guest root:
#   v1/            disk.img (GPT: ESP with UKI v1, verity root), uki.efi,
#                  cmdline, layout.env, pcrs.yaml: the released image
#   v2/            UKI + ESP over the same root with the v2 kernel
#   evil-cmdline/  UKI + ESP of v1 with one more kernel argument
#   agent-block    the root file system block holding the first bytes of
#                  /usr/bin/latchkey-agent (the root tamper step flips one)
# INPUT_KEY must change whenever what HOOK installs changes. The kit
# predicts PCR 11 with $P2_BIN/latchkey-verifier (build_latchkey).
build_measured() {
  local name=$1 hook=$2 input_key=$3 cmdline=$4 key tmp t0 kit=$REPO/$MEASURED_KIT old
  local verifier=${P2_BIN:?build_latchkey first}/latchkey-verifier
  key=$(key_of "$ROOTFS_DIR" "${GUEST_KERNELS[*]}" "$VMGUEST_BIN" "$input_key" "$VM_ROOT_SIZE" "$cmdline" \
    "$(sha256sum "$INITRD1" "$INITRD" "$kit" "$REPO/image/pe-authenticode.py" "$REPO/scripts/lib/common.sh" "$verifier")" \
    "$(tree_hash "$REPO/scripts/vm/guest")" "$(declare -f guest_common_setup "$hook" build_measured)" </dev/null)
  MEASURED=$VM_CACHE/measured-$name-$key
  [[ -f $MEASURED/.done ]] && return 0
  t0=$SECONDS
  tmp=$(mktemp -d "$VM_CACHE/.measured.XXXXXX")
  cp -a "$ROOTFS_DIR/root" "$tmp/root"
  guest_common_setup "$tmp/root"
  "$hook" "$tmp/root"
  "$kit" --verifier "$verifier" --root "$tmp/root" --kernel "$KERNEL1_DIR/vmlinuz" --initrd "$INITRD1" --root-size "$VM_ROOT_SIZE" \
    --cmdline "$cmdline" --out "$tmp/v1" >"$tmp/v1.log" 2>&1 || { cat "$tmp/v1.log" >&2; die "$MEASURED_KIT (v1) failed"; }
  "$kit" --verifier "$verifier" --reuse-root "$tmp/v1" --kernel "$KERNEL_DIR/vmlinuz" --initrd "$INITRD" --no-disk \
    --cmdline "$cmdline" --out "$tmp/v2" >"$tmp/v2.log" 2>&1 || { cat "$tmp/v2.log" >&2; die "$MEASURED_KIT (v2) failed"; }
  "$kit" --verifier "$verifier" --reuse-root "$tmp/v1" --kernel "$KERNEL1_DIR/vmlinuz" --initrd "$INITRD1" --no-disk \
    --cmdline "$cmdline $P2_EVIL_ARG" --out "$tmp/evil-cmdline" >"$tmp/evil.log" 2>&1 ||
    { cat "$tmp/evil.log" >&2; die "$MEASURED_KIT (evil-cmdline) failed"; }
  debugfs -R "bmap /usr/bin/latchkey-agent 0" "$tmp/v1/root.img" 2>/dev/null | grep -E '^[0-9]+$' >"$tmp/agent-block" ||
    die "cannot find latchkey-agent's first block in the root image"
  # disk.img holds the root and its hash tree; the separate copies only
  # served the variants.
  rm -f "$tmp/v1/root.img" "$tmp/v1/root.verity"
  safe_rm "$tmp/root"
  touch "$tmp/.done"
  for old in "$VM_CACHE"/measured-"$name"-*; do [[ $old != "$MEASURED" ]] && safe_rm "$old"; done
  mv "$tmp" "$MEASURED"
  log "measured image $name: built in $((SECONDS - t0)) s (root hash $(sed -n 's/^ROOT_HASH=//p' "$MEASURED/v1/layout.env"))"
}
