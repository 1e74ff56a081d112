#!/usr/bin/env bash
# Fails on product code no program reaches: runs deadcode
# (golang.org/x/tools/cmd/deadcode, the version pinned in scripts/tools/go.mod)
# over every main package of the module and compares what it reports with
# scripts/deadcode-allow.txt. Code used only by tests belongs in a _test.go
# file or a *test package, not in a product package.
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "$0")/lib/common.sh"
cd "$(repo_root)"

version=$(go -C scripts/tools list -m -f '{{.Version}}' golang.org/x/tools)
bin="$(cache_dir)/tools/deadcode-${version}"
if [[ ! -x "$bin/deadcode" ]]; then
  mkdir -p "$bin"
  GOBIN="$bin" go -C scripts/tools install golang.org/x/tools/cmd/deadcode
fi

module=$(go list -m)
mapfile -t mains < <(go list -f '{{if eq .Name "main"}}{{.ImportPath}}{{end}}' ./...)
found=$("$bin/deadcode" -f '{{range .Funcs}}{{$.Path}}.{{.Name}}{{"\n"}}{{end}}' "${mains[@]}" |
  sed "s|^${module}/||" | sed '/^$/d' | sort -u)
allowed=$(grep -v -e '^#' -e '^[[:space:]]*$' scripts/deadcode-allow.txt | sort -u)

dead=$(comm -23 <(echo "$found") <(echo "$allowed"))
stale=$(comm -13 <(echo "$found") <(echo "$allowed"))
if [[ -n $dead || -n $stale ]]; then
  [[ -z $dead ]] || printf 'deadcode: no program reaches these (delete them, or move test-only code into a _test.go file or a *test package):\n%s\n' "$dead" >&2
  [[ -z $stale ]] || printf 'deadcode: scripts/deadcode-allow.txt lists functions that are no longer dead (remove the entries):\n%s\n' "$stale" >&2
  exit 1
fi
echo "deadcode: every function is reached by a program (${#mains[@]} programs, $(wc -l <<<"$allowed") allowed)"
