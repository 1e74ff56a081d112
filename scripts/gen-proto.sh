#!/usr/bin/env bash
# Regenerates the Go code of proto/ with pinned generator versions.
#   scripts/gen-proto.sh          regenerate in place
#   scripts/gen-proto.sh --check  regenerate into a temp dir, fail on any diff
set -euo pipefail
cd "$(dirname "$0")/.."

PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2
bin="${LATCHKEY_CACHE_DIR:-$PWD/.cache}/protoc-gen/${PROTOC_GEN_GO_VERSION}-${PROTOC_GEN_GO_GRPC_VERSION}"
if [[ ! -x "$bin/protoc-gen-go" || ! -x "$bin/protoc-gen-go-grpc" ]]; then
  mkdir -p "$bin"
  GOBIN="$bin" go install "google.golang.org/protobuf/cmd/protoc-gen-go@${PROTOC_GEN_GO_VERSION}"
  GOBIN="$bin" go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@${PROTOC_GEN_GO_GRPC_VERSION}"
fi
command -v protoc >/dev/null || { echo "gen-proto: protoc not found (apt-get install protobuf-compiler)" >&2; exit 1; }

out=proto
if [[ "${1:-}" == "--check" ]]; then
  out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
fi
PATH="$bin:$PATH" protoc -I proto \
  --go_out="$out" --go_opt=paths=source_relative \
  --go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
  proto/latchkey/v1/latchkey.proto
if [[ "${1:-}" == "--check" ]]; then
  for f in latchkey.pb.go latchkey_grpc.pb.go; do
    if ! diff -u "proto/latchkey/v1/$f" "$out/latchkey/v1/$f"; then
      echo "gen-proto: proto/latchkey/v1/$f is stale; run scripts/gen-proto.sh" >&2
      exit 1
    fi
  done
  echo "gen-proto: generated code is up to date"
fi
