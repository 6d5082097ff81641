# Shared by build.sh and build_helm.sh (sourced, not run): their options, the version a go.mod pins, and the
# cache folder outside the repository, ${GPU_WEBHOOK_E2E_CACHE:-$HOME/.cache/gpu-webhook-e2e}/<name>.

# parse_options SCRIPT ARG...: sets force and print_only from --force and --print-dir.
parse_options() {
    local script="$1"
    shift
    force=0
    print_only=0
    for arg in "$@"; do
        case "$arg" in
            --force) force=1 ;;
            --print-dir) print_only=1 ;;
            *) echo "usage: $script [--force] [--print-dir]" >&2; exit 2 ;;
        esac
    done
}

# pinned_version SCRIPT GO_MOD MODULE: the version GO_MOD requires MODULE at, or exit 1 naming both.
pinned_version() {
    local version
    version="$(awk -v m="$3" '$1 == m && $2 ~ /^v/ {print $2; exit}' "$2")"
    if [[ -z "$version" ]]; then
        echo "$1: cannot read the $3 version from $2" >&2
        exit 1
    fi
    echo "$version"
}

# cache_dirs NAME: sets out (the cache folder of NAME) and bin (its bin folder); with --print-dir, prints bin
# and exits.
cache_dirs() {
    out="${GPU_WEBHOOK_E2E_CACHE:-$HOME/.cache/gpu-webhook-e2e}/$1"
    bin="$out/bin"
    if [[ "$print_only" == 1 ]]; then
        echo "$bin"
        exit 0
    fi
}

# require_go SCRIPT: exit 1 with what to do when there is no Go toolchain on PATH.
require_go() {
    if ! command -v go >/dev/null; then
        echo "$1: no Go toolchain on PATH; install Go >= 1.26 (the modules come from the Go module proxy)" >&2
        exit 1
    fi
}
