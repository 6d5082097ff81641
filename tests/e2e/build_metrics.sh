#!/usr/bin/env bash
# Builds VictoriaMetrics single-node (github.com/VictoriaMetrics/VictoriaMetrics/app/victoria-metrics, the `tool`
# of tests/e2e/metrics/go.mod) from the Go module proxy into a cache outside the repository, as build.sh does for
# the control plane:
#   ${GPU_WEBHOOK_E2E_CACHE:-$HOME/.cache/gpu-webhook-e2e}/victoria-metrics-<version>/bin/victoria-metrics
# It is the real metrics server `gpu-webhook usage` is tested against (tests/e2e/test_16_usage.py): it serves the
# Prometheus query API (/api/v1/query, /api/v1/query_range) and takes recorded exposition text with timestamps on
# /api/v1/import/prometheus, so a week of dcgm-exporter samples is backfilled in a second instead of scraped for a
# week. The bin directory is printed as the last line.
# Idempotent: a stamp holds the hash of go.mod, go.sum, this script and `go version`; when it matches and the
# binary is there, nothing is rebuilt.
# Options: --force rebuilds; --print-dir prints the bin directory and exits (no build).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
module="$here/metrics"
# shellcheck source=build_lib.sh
source "$here/build_lib.sh"
parse_options "$0" "$@"
vm_version="$(pinned_version build_metrics.sh "$module/go.mod" github.com/VictoriaMetrics/VictoriaMetrics)"
cache_dirs "victoria-metrics-$vm_version"

require_go build_metrics.sh
want_stamp="$( { go version; sha256sum "$module/go.mod" "$module/go.sum" "$here/build_metrics.sh" "$here/build_lib.sh" \
    | cut -d' ' -f1; } | sha256sum | cut -d' ' -f1)"
if [[ "$force" == 0 && -x "$bin/victoria-metrics" && -f "$out/stamp" && "$(cat "$out/stamp")" == "$want_stamp" ]]; then
    echo "build_metrics.sh: victoria-metrics $vm_version is up to date in $bin" >&2
    echo "$bin"
    exit 0
fi

mkdir -p "$bin"
rm -f "$out/stamp"
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly"
# What VictoriaMetrics' own Makefile stamps into a release build.
ldflags="-s -w -X github.com/VictoriaMetrics/VictoriaMetrics/lib/buildinfo.Version=victoria-metrics-$vm_version"

# Built to a temporary name then moved, so an interrupted build never leaves a half-written binary behind.
tmp="$(mktemp -d "$out/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
echo "build_metrics.sh: building victoria-metrics $vm_version ..." >&2
(cd "$module" && go build -trimpath -ldflags "$ldflags" -o "$tmp/victoria-metrics" \
    github.com/VictoriaMetrics/VictoriaMetrics/app/victoria-metrics)
mv -f "$tmp/victoria-metrics" "$bin/victoria-metrics"
echo "$want_stamp" > "$out/stamp"
echo "build_metrics.sh: victoria-metrics $vm_version built in $bin in $((SECONDS - start)) s" >&2
echo "$bin"
