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

# stamp_of FILE...: the hash of `go version` and of the files, a build's inputs.
stamp_of() {
    { go version; sha256sum "$@" | cut -d' ' -f1; } | sha256sum | cut -d' ' -f1
}

# exit_if_up_to_date SCRIPT WHAT STAMP BINARY...: without --force, when the cache's stamp is STAMP and every
# BINARY is in the bin folder, say that WHAT is up to date, print the bin folder and exit 0.
exit_if_up_to_date() {
    local script="$1" what="$2" stamp="$3" binary
    shift 3
    [[ "$force" == 0 && -f "$out/stamp" && "$(cat "$out/stamp")" == "$stamp" ]] || return 0
    for binary in "$@"; do [[ -x "$bin/$binary" ]] || return 0; done
    echo "$script: $what is up to date in $bin" >&2
    echo "$bin"
    exit 0
}

# begin_build: the bin folder made and its stamp removed, static Go builds from the pinned go.sum, and `tmp`, a
# folder removed on exit: binaries are built there and then moved, so an interrupted build never leaves a
# half-written binary behind.
begin_build() {
    mkdir -p "$bin"
    rm -f "$out/stamp"
    export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly"
    tmp="$(mktemp -d "$out/.build.XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
}

# k8s_ldflags VERSION: -s -w (no symbol table or DWARF, as upstream's release builds; linking takes less than
# half) and the version variables hack/lib/version.sh sets.
k8s_ldflags() {
    local minor="${1#v1.}" pkg flags="-s -w"
    minor="${minor%%.*}"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X '$pkg.gitVersion=$1' -X '$pkg.gitMajor=1' -X '$pkg.gitMinor=$minor'"
        flags+=" -X '$pkg.gitTreeState=clean' -X '$pkg.buildDate=1970-01-01T00:00:00Z'"
    done
    echo "$flags"
}

# step SCRIPT NAME COMMAND...: runs one build step, saying what it builds and how long it took.
step() {
    local script="$1" name="$2" start=$SECONDS
    shift 2
    echo "$script: building $name ..." >&2
    "$@"
    echo "$script: $name built in $((SECONDS - start)) s" >&2
}
