#!/usr/bin/env bash
# Builds the peer policy engines compared in docs/comparison.md from the Go module proxy, into a cache outside the
# repository (the same cache folder as tests/e2e/build.sh):
#   kyverno     Kyverno's admission controller (github.com/kyverno/kyverno/cmd/kyverno, the `tool` of kyverno/go.mod)
#               -> ${GPU_WEBHOOK_E2E_CACHE:-$HOME/.cache/gpu-webhook-e2e}/kyverno-<version>/bin/kyverno
#   gatekeeper  Gatekeeper's controller manager and webhook (github.com/open-policy-agent/gatekeeper/v3, the main
#               package at the module root, the `tool` of gatekeeper/go.mod)
#               -> ${GPU_WEBHOOK_E2E_CACHE:-$HOME/.cache/gpu-webhook-e2e}/gatekeeper-<version>/bin/gatekeeper
# and prints the bin directory as the last line. Each engine's module source (CRDs, chart) is the one in the Go
# module cache at the same version (`go env GOMODCACHE`), which bench/peers/run.py reads.
#
# Usage: bench/peers/build.sh kyverno|gatekeeper [--force] [--print-dir]
# Idempotent: a stamp holds the hash of the engine's go.mod, go.sum, this script, tests/e2e/build_lib.sh and
# `go version`; when it matches and the binary is there, nothing is rebuilt. A cold build takes 10-20 minutes
# on 2 cores (both are large: cloud SDKs, OPA, CEL); this is a benchmark tool, never run by CI.
#
# kyverno/go.mod carries one replace copied from Kyverno's own go.mod (k8s.io/pod-security-admission =>
# github.com/kyverno/pod-security-admission): a consumer's build ignores a dependency's replaces, and Kyverno does
# not compile against the upstream module.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
lib="$here/../../tests/e2e/build_lib.sh"
# shellcheck source=../../tests/e2e/build_lib.sh
source "$lib"

engine="${1:-}"
case "$engine" in
    kyverno) module_path=github.com/kyverno/kyverno; package=github.com/kyverno/kyverno/cmd/kyverno ;;
    gatekeeper) module_path=github.com/open-policy-agent/gatekeeper/v3; package=$module_path ;;
    *) echo "usage: $0 kyverno|gatekeeper [--force] [--print-dir]" >&2; exit 2 ;;
esac
shift
parse_options "$0 $engine" "$@"
module="$here/$engine"
version="$(pinned_version build.sh "$module/go.mod" "$module_path")"
cache_dirs "$engine-$version"
require_go build.sh

want_stamp="$(stamp_of "$module/go.mod" "$module/go.sum" "$here/build.sh" "$lib")"
exit_if_up_to_date build.sh "$engine $version" "$want_stamp" "$engine"

begin_build
# The version variables each project's Makefile sets for a release build.
case "$engine" in
    kyverno) ldflags="-s -w -X github.com/kyverno/kyverno/pkg/version.BuildVersion=$version" ;;
    gatekeeper) ldflags="-s -w -X github.com/open-policy-agent/gatekeeper/v3/pkg/version.Version=$version" ;;
esac

step build.sh "$engine $version" \
    bash -c 'cd "$1" && nice -n 10 go build -trimpath -ldflags "$2" -o "$3" "$4"' _ "$module" "$ldflags" "$tmp/$engine" \
    "$package"
mv -f "$tmp/$engine" "$bin/$engine"
echo "$want_stamp" > "$out/stamp"
echo "build.sh: $engine $version built in $bin" >&2
echo "$bin"
