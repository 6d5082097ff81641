#!/usr/bin/env bash
# Builds helm (helm.sh/helm/v4/cmd/helm, the `tool` of tests/e2e/helm/go.mod) from the Go module proxy into a
# cache outside the repository, as build.sh does for the control plane:
#   ${GPU_WEBHOOK_E2E_CACHE:-$HOME/.cache/gpu-webhook-e2e}/helm-<version>/bin/helm
# The bin directory is printed as the last line.
# Idempotent: a stamp holds the hash of go.mod, go.sum, this script and `go version`; when it matches and the
# binary is there, nothing is rebuilt (a warm run takes well under a second).
# Options: --force rebuilds; --print-dir prints the bin directory and exits (no build).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
module="$here/helm"
# shellcheck source=build_lib.sh
source "$here/build_lib.sh"
parse_options "$0" "$@"
helm_version="$(pinned_version build_helm.sh "$module/go.mod" helm.sh/helm/v4)"
cache_dirs "helm-$helm_version"

require_go build_helm.sh
want_stamp="$(stamp_of "$module/go.mod" "$module/go.sum" "$here/build_helm.sh" "$here/build_lib.sh")"
exit_if_up_to_date build_helm.sh "helm $helm_version" "$want_stamp" helm

begin_build
# What helm's own Makefile sets for a release build from a tag.
pkg=helm.sh/helm/v4/internal/version
ldflags="-s -w -X $pkg.version=$helm_version -X $pkg.metadata= -X $pkg.gitTreeState=clean"

step build_helm.sh "helm $helm_version" \
    bash -c 'cd "$1" && go build -trimpath -ldflags "$2" -o "$3/helm" helm.sh/helm/v4/cmd/helm' _ "$module" "$ldflags" "$tmp"
mv -f "$tmp/helm" "$bin/helm"
echo "$want_stamp" > "$out/stamp"
echo "build_helm.sh: helm $helm_version built in $bin" >&2
echo "$bin"
