#!/usr/bin/env bash
# Regenerates the Go code of proto/ with pinned generator versions.
#   scripts/gen-proto.sh          regenerate in place
#   scripts/gen-proto.sh --check  regenerate into a temp dir, fail on any diff
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "$0")/lib/common.sh"
cd "$(repo_root)"

PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2
bin="${LATCHKEY_CACHE_DIR:-$PWD/.cache}/protoc-gen/${PROTOC_GEN_GO_VERSION}-${PROTOC_GEN_GO_GRPC_VERSION}"
if [[ ! -x "$bin/protoc-gen-go" || ! -x "$bin/protoc-gen-go-grpc" ]]; then
  mkdir -p "$bin"
  GOBIN="$bin" go install "google.golang.org/protobuf/cmd/protoc-gen-go@${PROTOC_GEN_GO_VERSION}"
  GOBIN="$bin" go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@${PROTOC_GEN_GO_GRPC_VERSION}"
fi
command -v protoc >/dev/null || die "protoc not found (apt-get install protobuf-compiler)"

out=proto
if [[ "${1:-}" == "--check" ]]; then
  out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
fi
mapfile -t protos < <(cd proto && find . -name '*.proto' | sed 's|^\./||' | sort)
PATH="$bin:$PATH" protoc -I proto \
  --go_out="$out" --go_opt=paths=source_relative \
  --go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
  "${protos[@]}"
if [[ "${1:-}" == "--check" ]]; then
  stale=0
  while IFS= read -r f; do
    rel=${f#"$out"/}
    if ! diff -u "proto/$rel" "$f"; then
      echo "gen-proto: proto/$rel is stale; run scripts/gen-proto.sh" >&2
      stale=1
    fi
  done < <(find "$out" -name '*.go' | sort)
  committed=$(cd proto && find . -name '*.pb.go' | wc -l)
  generated=$(find "$out" -name '*.pb.go' | wc -l)
  if [[ "$committed" != "$generated" ]]; then
    echo "gen-proto: proto/ holds $committed generated files, generation makes $generated" >&2
    stale=1
  fi
  [[ $stale == 0 ]] || exit 1
  echo "gen-proto: generated code is up to date"
fi
