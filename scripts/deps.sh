# Sourced by the scripts: makes sure Debian's packages fulgur needs are
# installed. As root it installs them with apt-get; otherwise it prints the
# exact line to run and stops.
fg_need_packages() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" = 0 ]; then
        echo "installing: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null || {
            echo "apt-get install failed for: ${missing[*]}" >&2; return 1; }
    else
        echo "fulgur needs these Debian packages; run:" >&2
        echo "  sudo apt-get install -y ${missing[*]}" >&2
        return 1
    fi
}

# What the library builds against (OpenBLAS's OpenMP flavour: one threading
# runtime for OpenBLAS and fulgur's kernels), and what the tests use.
FG_BUILD_PACKAGES="libopenblas-openmp-dev libdnnl-dev libopenmpi-dev openmpi-bin libjansson-dev pkg-config"

fg_jobs() { nproc 2>/dev/null || echo 2; }
