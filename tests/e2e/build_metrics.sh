#!/usr/bin/env bash
# Builds VictoriaMetrics single-node and vmalert (github.com/VictoriaMetrics/VictoriaMetrics/app/victoria-metrics
# and app/vmalert, the `tool`s of tests/e2e/metrics/go.mod) from the Go module proxy into a cache outside the
# repository, as build.sh does for the control plane:
#   ${GPU_WEBHOOK_E2E_CACHE:-$HOME/.cache/gpu-webhook-e2e}/victoria-metrics-<version>/bin/{victoria-metrics,vmalert}
# victoria-metrics is the real metrics server `gpu-webhook usage` is tested against (tests/e2e/test_16_usage.py): it
# serves the Prometheus query API (/api/v1/query, /api/v1/query_range) and takes recorded exposition text with
# timestamps on /api/v1/import/prometheus, so a week of dcgm-exporter samples is backfilled in a second instead of
# scraped for a week. vmalert is the rule evaluator the chart's PrometheusRule alerts are proven with
# (tests/e2e/test_23_alerts.py): its -replay mode evaluates the rules over such backfilled data.
# The bin directory is printed as the last line.
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
want_stamp="$(stamp_of "$module/go.mod" "$module/go.sum" "$here/build_metrics.sh" "$here/build_lib.sh")"
exit_if_up_to_date build_metrics.sh "victoria-metrics and vmalert $vm_version" "$want_stamp" victoria-metrics vmalert

begin_build
for app in victoria-metrics vmalert; do
    # What VictoriaMetrics' own Makefile stamps into a release build.
    ldflags="-s -w -X github.com/VictoriaMetrics/VictoriaMetrics/lib/buildinfo.Version=$app-$vm_version"
    step build_metrics.sh "$app $vm_version" \
        bash -c 'cd "$1" && go build -trimpath -ldflags "$2" -o "$3/$4" \
            "github.com/VictoriaMetrics/VictoriaMetrics/app/$4"' _ "$module" "$ldflags" "$tmp" "$app"
    mv -f "$tmp/$app" "$bin/$app"
done
echo "$want_stamp" > "$out/stamp"
echo "build_metrics.sh: victoria-metrics and vmalert $vm_version built in $bin" >&2
echo "$bin"
