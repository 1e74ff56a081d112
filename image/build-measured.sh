#!/usr/bin/env bash
# Builds a measured boot image from a root directory and a kernel + initrd,
# with Debian packages only, and prints the PCR values a TPM will hold when
# UEFI firmware boots it (the verifier policy to admit it).
#
#   image/build-measured.sh --root DIR --kernel FILE --initrd FILE --out DIR [options]
#   image/build-measured.sh --reuse-root OUT --kernel FILE --initrd FILE --out DIR [options]
#
#   --root DIR        the root file system; it becomes a read-only ext4 under
#                     dm-verity. The kit prepares DIR for that first: it
#                     writes etc/fstab (root read-only, tmpfs on /tmp and
#                     /var/tmp) and the mount points latchkey's agent needs
#   --reuse-root OUT  keep the verified root of an earlier build in OUT (its
#                     root hash and geometry) and build only a new UKI and
#                     ESP: an upgrade of the kernel, initrd or command line
#   --kernel FILE     the kernel (a bzImage with an EFI stub: Debian's vmlinuz)
#   --initrd FILE     the initrd; it must open the verity root (roothash= and
#                     systemd.verity_root_*= on the command line)
#   --cmdline ARGS    kernel arguments added after the kit's own (console=,
#                     latchkey.verifier=, latchkey.pin=, ...)
#   --out DIR         output folder (created; must not exist or be empty)
#   --osrel FILE      the UKI's .osrel (default: DIR/etc/os-release)
#   --disk DEV        the boot disk as the guest kernel names it (/dev/vda):
#                     root data is DEV2, the hash tree DEV3
#   --root-size SIZE  size of the root file system image (default 1536M)
#   --esp-size MIB    size of the EFI system partition (default 64)
#   --phase PHASE     systemd-pcrphase words measured into PCR 11 before the
#                     agent joins (default: auto = "sysinit" when the root
#                     has systemd-pcrphase and the TPM libraries it loads,
#                     "" otherwise); PHASE:ready, the value re-attestations
#                     quote once the boot is up, is predicted with it
#   --verifier BIN    the latchkey-verifier whose `policy predict` computes
#                     PCR 11 and the UKI's digest (default: $LATCHKEY_VERIFIER,
#                     else latchkey-verifier on PATH, else built from this
#                     checkout with go)
#   --no-disk         write the UKI and the ESP image only, not disk.img
#
# Outputs in --out: uki.efi (systemd-stub + .osrel .cmdline .linux .initrd),
# esp.img (FAT, \EFI\BOOT\BOOTX64.EFI), root.img + root.verity (ext4 data,
# dm-verity hash tree), disk.img (GPT: ESP, root, root-verity), cmdline,
# layout.env (root hash, geometry, partition offsets), pcrs.yaml (the
# predicted PCRs as a latchkey policy fragment) and pcrs.json. The
# predicted PCRs also go to stdout. See docs/measured-boot.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/lib/common.sh
source "$HERE/../scripts/lib/common.sh"

STUB=/usr/lib/systemd/boot/efi/linuxx64.efi.stub
VERIFIER=${LATCHKEY_VERIFIER:-}
ROOT_DIR=""
REUSE=""
KERNEL=""
INITRD=""
EXTRA_CMDLINE=""
OUT=""
OSREL=""
DISK_DEV=/dev/vda
ROOT_SIZE=1536M
ESP_MIB=64
PHASE=auto
MAKE_DISK=1

# GPT partition types of the Discoverable Partitions Specification (x86-64).
TYPE_ESP=C12A7328-F81F-11D2-BA4B-00A0C93EC93B
TYPE_ROOT=4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709
TYPE_VERITY=2C7357ED-EBD2-46D9-AEC1-23D437EC2BF5
# What OVMF (EDK2's boot manager and Tcg2Dxe) measures into PCR 4 on a
# direct boot of a boot option: this action string, the separator, then
# the Authenticode digest of every image it loads (docs/measured-boot.md).
EV_ACTION_BOOT="Calling EFI Application from Boot Option"

say() { echo "build-measured.sh: $*" >&2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

parse_args() {
  while (($#)); do
    case $1 in
      --root) ROOT_DIR=${2:?--root needs a directory}; shift ;;
      --reuse-root) REUSE=${2:?--reuse-root needs an output folder}; shift ;;
      --kernel) KERNEL=${2:?--kernel needs a file}; shift ;;
      --initrd) INITRD=${2:?--initrd needs a file}; shift ;;
      --cmdline) EXTRA_CMDLINE=${2?--cmdline needs arguments}; shift ;;
      --out) OUT=${2:?--out needs a folder}; shift ;;
      --osrel) OSREL=${2:?--osrel needs a file}; shift ;;
      --disk) DISK_DEV=${2:?--disk needs a device}; shift ;;
      --root-size) ROOT_SIZE=${2:?--root-size needs a size}; shift ;;
      --esp-size) ESP_MIB=${2:?--esp-size needs MiB}; shift ;;
      --phase) PHASE=${2?--phase needs a phase or auto}; shift ;;
      --verifier) VERIFIER=${2:?--verifier needs a binary}; shift ;;
      --no-disk) MAKE_DISK=0 ;;
      -h | --help) usage; exit 0 ;;
      *) usage >&2; exit 2 ;;
    esac
    shift
  done
  [[ -n $KERNEL && -n $INITRD && -n $OUT ]] || { usage >&2; exit 2; }
  [[ -n $ROOT_DIR || -n $REUSE ]] || die "--root or --reuse-root is required"
  [[ -z $ROOT_DIR || -z $REUSE ]] || die "--root and --reuse-root exclude each other"
  [[ -f $KERNEL ]] || die "kernel $KERNEL not found"
  [[ -f $INITRD ]] || die "initrd $INITRD not found"
  [[ $ESP_MIB =~ ^[0-9]+$ ]] || die "--esp-size $ESP_MIB: want MiB"
  if [[ -n $ROOT_DIR ]]; then
    [[ -d $ROOT_DIR ]] || die "root $ROOT_DIR is not a directory"
    ROOT_DIR=$(cd "$ROOT_DIR" && pwd)
    [[ $ROOT_DIR != / ]] || die "refusing / as the root directory"
    [[ -n $OSREL ]] || OSREL=$ROOT_DIR/etc/os-release
  else
    [[ -f $REUSE/layout.env ]] || die "$REUSE has no layout.env (not an output of this script)"
    [[ -n $OSREL ]] || OSREL=$REUSE/osrel
  fi
  [[ -f $OSREL ]] || die "os-release $OSREL not found (--osrel)"
  if [[ -e $OUT && -n $(ls -A "$OUT") ]]; then die "$OUT exists and is not empty"; fi
  mkdir -p "$OUT"
  OUT=$(cd "$OUT" && pwd)
}

check_tools() {
  need_packages objcopy:binutils mkfs.fat:dosfstools mcopy:mtools veritysetup:cryptsetup-bin \
    sgdisk:gdisk mkfs.ext4:e2fsprogs python3:python3
  [[ -f $STUB ]] || need_packages "no-such-command-stub:systemd-boot-efi"
  [[ -f $STUB ]] || die "$STUB missing (package systemd-boot-efi)"
  find_verifier
}

# find_verifier: the latchkey-verifier that predicts, so the kit holds no
# second implementation of the PCR 11 arithmetic the verifier checks.
find_verifier() {
  if [[ -z $VERIFIER ]] && command -v latchkey-verifier >/dev/null; then VERIFIER=$(command -v latchkey-verifier); fi
  if [[ -z $VERIFIER ]]; then
    [[ -f $HERE/../go.mod ]] || die "no latchkey-verifier (--verifier, LATCHKEY_VERIFIER or PATH)"
    command -v go >/dev/null || die "no latchkey-verifier and no go to build it (--verifier)"
    VERIFIER_DIR=$(mktemp -d)
    trap 'rm -rf "$VERIFIER_DIR"' EXIT
    (cd "$HERE/.." && CGO_ENABLED=0 go build -o "$VERIFIER_DIR/latchkey-verifier" ./verifier/cmd/latchkey-verifier) ||
      die "go build of latchkey-verifier failed"
    VERIFIER=$VERIFIER_DIR/latchkey-verifier
  fi
  [[ -x $VERIFIER ]] || die "latchkey-verifier $VERIFIER is not executable"
}

# prepare_root: what a read-only root needs: fstab with the root "ro" (the
# initrd mounts it read-only anyway; systemd-remount-fs keeps it so), tmpfs
# where programs expect to write, and the agent's mount points, which
# cannot be created on the verified root at boot.
prepare_root() {
  cat >"$ROOT_DIR/etc/fstab" <<'EOF'
# Written by latchkey's image/build-measured.sh: the root is a read-only
# dm-verity device; the LUKS state disk (mounted by latchkey-agent) is the
# only persistent writable storage.
/dev/mapper/root  /         ext4   ro,noatime               0 0
tmpfs             /tmp      tmpfs  mode=1777,nosuid,nodev   0 0
tmpfs             /var/tmp  tmpfs  mode=1777,nosuid,nodev   0 0
EOF
  if [[ -e $ROOT_DIR/usr/bin/latchkey-agent ]]; then
    install -d -m 0700 "$ROOT_DIR/var/lib/latchkey" "$ROOT_DIR/var/lib/latchkey/state"
    # The state disk's default bind mounts (agent/disk DefaultBindMounts;
    # list yours here if agent.yaml names others).
    install -d -m 0755 "$ROOT_DIR/etc/kubernetes" "$ROOT_DIR/var/lib/kubelet" "$ROOT_DIR/var/lib/etcd" \
      "$ROOT_DIR/var/lib/containerd"
  fi
}

# detect_phase: systemd-pcrphase-sysinit.service measures "sysinit" into
# PCR 11 before basic.target, so before the agent joins, when it finds the
# TPM libraries; "ready" comes after the join (the agent's unit is ordered
# before systemd-pcrphase.service) and before every re-attestation.
detect_phase() {
  [[ $PHASE == auto ]] || return 0
  PHASE=""
  [[ -n $ROOT_DIR ]] || { PHASE=$(sed -n 's/^PHASE=//p' "$REUSE/layout.env"); return 0; }
  if [[ -e $ROOT_DIR/usr/lib/systemd/systemd-pcrphase || -e $ROOT_DIR/lib/systemd/systemd-pcrphase ]] &&
    compgen -G "$ROOT_DIR/usr/lib/*/libtss2-esys.so.0*" >/dev/null; then
    PHASE=sysinit
  fi
}

# build_root: root.img (ext4 from DIR) and its hash tree root.verity, with
# a salt derived from the image so the same tree builds the same root hash.
build_root() {
  local salt info
  mkfs.ext4 -q -F -L latchkey-root -E root_owner=0:0 -d "$ROOT_DIR" "$OUT/root.img" "$ROOT_SIZE" >/dev/null ||
    die "mkfs.ext4 -d failed"
  salt=$(sha256sum "$OUT/root.img" | cut -c1-64)
  info=$(veritysetup format --no-superblock --hash=sha256 --data-block-size=4096 --hash-block-size=4096 \
    --salt="$salt" "$OUT/root.img" "$OUT/root.verity") || die "veritysetup format failed"
  ROOT_HASH=$(awk '/^Root hash:/ {print $3}' <<<"$info")
  [[ $ROOT_HASH =~ ^[0-9a-f]{64}$ ]] || die "veritysetup printed no root hash"
  SALT=$salt
  DATA_BLOCKS=$(($(stat -c %s "$OUT/root.img") / 4096))
  cp "$OSREL" "$OUT/osrel"
}

reuse_root() {
  local v
  for v in ROOT_HASH SALT DATA_BLOCKS ROOT_BYTES VERITY_BYTES; do
    printf -v "$v" '%s' "$(sed -n "s/^$v=//p" "$REUSE/layout.env")"
  done
  [[ $ROOT_HASH =~ ^[0-9a-f]{64}$ ]] || die "$REUSE/layout.env has no root hash"
  cp "$OSREL" "$OUT/osrel"
}

# build_uki: systemd-stub plus its sections, each at the next free 4 KiB
# aligned address after the stub's own (objcopy wants absolute VMAs; the
# stub's image base is 0).
build_uki() {
  local cmdline=$1 base vma sec file args=() size
  printf '%s' "$cmdline" >"$OUT/cmdline"
  base=$(objdump -p "$STUB" | awk '$1 == "ImageBase" {print $2}')
  local idx hsize hvma end
  vma=0
  while read -r idx _ hsize hvma _; do
    [[ $idx =~ ^[0-9]+$ ]] || continue
    end=$((16#$hvma + 16#$hsize))
    ((end > vma)) && vma=$end
  done < <(objdump -h "$STUB")
  ((vma > 0)) || die "cannot read the sections of $STUB"
  vma=$(((vma + 0xfff) & ~0xfff))
  for sec in osrel:"$OUT/osrel" cmdline:"$OUT/cmdline" linux:"$KERNEL" initrd:"$INITRD"; do
    file=${sec#*:}
    args+=(--add-section ".${sec%%:*}=$file" --change-section-vma ".${sec%%:*}=$(printf '0x%x' "$vma")")
    size=$(stat -L -c %s "$file")
    vma=$(((vma + size + 0xfff) & ~0xfff))
  done
  [[ $((16#${base:-0})) == 0 ]] || die "unexpected stub image base $base"
  objcopy "${args[@]}" "$STUB" "$OUT/uki.efi" || die "objcopy (UKI assembly) failed"
}

build_esp() {
  rm -f "$OUT/esp.img"
  mkfs.fat -C -n ESP "$OUT/esp.img" $((ESP_MIB * 1024)) >/dev/null || die "mkfs.fat failed"
  mmd -i "$OUT/esp.img" ::/EFI ::/EFI/BOOT
  mcopy -i "$OUT/esp.img" "$OUT/uki.efi" ::/EFI/BOOT/BOOTX64.EFI || die "mcopy of the UKI failed"
}

# build_disk: one GPT disk: ESP, root (data), root-verity (hash tree). The
# root partition's UUID is the first half of the root hash and the verity
# partition's the second half, as the Discoverable Partitions Specification
# suggests, so tools can pair them.
build_disk() {
  local esp_start=2048 root_start root_end hash_start hash_end total
  local root_src=$OUT/root.img verity_src=$OUT/root.verity
  if [[ -n $REUSE ]]; then root_src=$REUSE/root.img verity_src=$REUSE/root.verity; fi
  ROOT_BYTES=$(stat -c %s "$root_src")
  VERITY_BYTES=$(stat -c %s "$verity_src")
  root_start=$((esp_start + ESP_MIB * 2048))
  root_end=$((root_start + ((ROOT_BYTES + 1048575) / 1048576) * 2048 - 1))
  hash_start=$((root_end + 1))
  hash_end=$((hash_start + ((VERITY_BYTES + 1048575) / 1048576) * 2048 - 1))
  total=$(((hash_end + 1 + 2048) * 512))
  ESP_OFFSET=$((esp_start * 512)) ROOT_OFFSET=$((root_start * 512)) VERITY_OFFSET=$((hash_start * 512))
  ((MAKE_DISK)) || return 0
  uuid() { printf '%s-%s-%s-%s-%s' "${1:0:8}" "${1:8:4}" "${1:12:4}" "${1:16:4}" "${1:20:12}"; }
  truncate -s "$total" "$OUT/disk.img"
  sgdisk --clear \
    -n "1:$esp_start:$((root_start - 1))" -t "1:$TYPE_ESP" -c 1:esp \
    -n "2:$root_start:$root_end" -t "2:$TYPE_ROOT" -c 2:root-x86-64 -u "2:$(uuid "${ROOT_HASH:0:32}")" \
    -n "3:$hash_start:$hash_end" -t "3:$TYPE_VERITY" -c 3:root-x86-64-verity -u "3:$(uuid "${ROOT_HASH:32:32}")" \
    "$OUT/disk.img" >/dev/null || die "sgdisk failed"
  dd if="$OUT/esp.img" of="$OUT/disk.img" bs=1M seek=$((ESP_OFFSET / 1048576)) conv=notrunc,sparse status=none
  dd if="$root_src" of="$OUT/disk.img" bs=1M seek=$((ROOT_OFFSET / 1048576)) conv=notrunc,sparse status=none
  dd if="$verity_src" of="$OUT/disk.img" bs=1M seek=$((VERITY_OFFSET / 1048576)) conv=notrunc,sparse status=none
}

# sha256 of a string (no newline).
sha256_of() { printf '%s' "$1" | sha256sum | cut -c1-64; }

# extend PCR DIGEST: PCR := sha256(PCR || DIGEST), in hex.
extend() { printf '%s%s' "$1" "$2" | xxd -r -p | sha256sum | cut -c1-64; }

# predict: PCR 4 (firmware: the action string, the separator, the UKI,
# then the kernel: systemd-stub 252 starts .linux with LoadImage, so the
# firmware measures the kernel's Authenticode digest too), PCR 11 (the
# sections and the phase words, by `latchkey-verifier policy predict`: at
# the join PHASE, once the boot is up PHASE:ready) and PCR 12 (zero:
# nothing passed a command line or credentials to the stub). Checked
# against a real OVMF event log: docs/measured-boot.md.
predict() {
  local zero pcr4 uki kernel phases=(--phase "$PHASE") out pcr11 pcr12 n quoted11 ready_note
  zero=$(printf '%064d' 0)
  [[ -n $PHASE ]] && phases+=(--phase "$PHASE:ready")
  out=$("$VERIFIER" policy predict --uki "$OUT/uki.efi" --secure-boot-off "${phases[@]}") ||
    die "latchkey-verifier policy predict failed for $OUT/uki.efi"
  uki=$(sed -n 's/^    - sha256:\([0-9a-f]\{64\}\)$/\1/p' <<<"$out")
  pcr11=$(sed -n 's/^    - \([0-9a-f]\{64\}\)$/\1/p' <<<"$out")
  [[ $uki =~ ^[0-9a-f]{64}$ ]] || die "policy predict printed no uki digest"
  n=$(grep -c . <<<"$pcr11" || true)
  ((n == ${#phases[@]} / 2)) || die "policy predict printed $n pcr 11 values for $((${#phases[@]} / 2)) phases"
  kernel=$(python3 "$HERE/pe-authenticode.py" "$KERNEL") || die "authenticode digest of the kernel failed"
  pcr4=$(extend "$zero" "$(sha256_of "$EV_ACTION_BOOT")")
  pcr4=$(extend "$pcr4" "$(printf '\0\0\0\0' | sha256sum | cut -c1-64)")
  pcr4=$(extend "$pcr4" "$uki")
  pcr4=$(extend "$pcr4" "$kernel")
  pcr12=$zero
  # PCR11 is the join's value (what the agent quotes during the boot);
  # PCR11_ALL adds the re-attestations' (after "ready").
  UKI_DIGEST=$uki PCR4=$pcr4 PCR11=$(head -n1 <<<"$pcr11") PCR12=$pcr12
  PCR11_ALL=$(paste -sd, <<<"$pcr11")
  quoted11="\"${PCR11_ALL//,/\", \"}\""
  ready_note=""
  [[ -z $PHASE ]] || ready_note=" (join) and \"$PHASE:ready\" (re-attestation)"
  cat >"$OUT/pcrs.yaml" <<EOF
# Predicted by image/build-measured.sh with latchkey-verifier policy
# predict for $(basename "$OUT"): UKI authenticode sha256:$uki,
# kernel sha256:$kernel, root hash $ROOT_HASH,
# PCR 11 in systemd-pcrphase phase "$PHASE"$ready_note.
# Paste under tpm: in the verifier policy, next to the values of the
# images in production.
pcrs:
  "4": ["$pcr4"]
  "11": [$quoted11]
  "12": ["$pcr12"]
EOF
  printf '{"uki_authenticode_sha256":"%s","kernel_authenticode_sha256":"%s","root_hash":"%s","phase":"%s","pcrs":{"4":"%s","11":"%s","12":"%s"},"pcr11_all":["%s"]}\n' \
    "$uki" "$kernel" "$ROOT_HASH" "$PHASE" "$pcr4" "$PCR11" "$pcr12" "${PCR11_ALL//,/\",\"}" >"$OUT/pcrs.json"
}

write_layout() {
  cat >"$OUT/layout.env" <<EOF
ROOT_HASH=$ROOT_HASH
SALT=$SALT
DATA_BLOCKS=$DATA_BLOCKS
ROOT_BYTES=$ROOT_BYTES
VERITY_BYTES=$VERITY_BYTES
ESP_OFFSET=$ESP_OFFSET
ROOT_OFFSET=$ROOT_OFFSET
VERITY_OFFSET=$VERITY_OFFSET
PHASE=$PHASE
UKI_AUTHENTICODE=$UKI_DIGEST
PCR4=$PCR4
PCR11=$PCR11
PCR11_ALL=$PCR11_ALL
PCR12=$PCR12
EOF
}

main() {
  parse_args "$@"
  check_tools
  command -v xxd >/dev/null || need_packages xxd:xxd
  detect_phase
  if [[ -n $ROOT_DIR ]]; then
    prepare_root
    build_root
  else
    reuse_root
  fi
  local opts cmdline
  opts="superblock=false,data-blocks=$DATA_BLOCKS,hash-offset=0,salt=$SALT,panic-on-corruption"
  cmdline="ro roothash=$ROOT_HASH systemd.verity_root_data=${DISK_DEV}2 systemd.verity_root_hash=${DISK_DEV}3"
  cmdline+=" systemd.verity_root_options=$opts${EXTRA_CMDLINE:+ $EXTRA_CMDLINE}"
  build_uki "$cmdline"
  build_esp
  build_disk
  predict
  write_layout
  say "root hash $ROOT_HASH, UKI authenticode $UKI_DIGEST, phase \"$PHASE\""
  cat "$OUT/pcrs.yaml"
}

main "$@"
