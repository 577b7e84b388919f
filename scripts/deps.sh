# Sourced by the scripts: makes sure Debian's packages fulgur needs are
# installed. As root it installs them with apt-get; otherwise it prints the
# exact line to run and stops.

# apt-get "$@", waiting up to FG_APT_WAIT_S seconds (300) for another
# apt-get or dpkg to finish instead of failing at once: DPkg::Lock::Timeout
# makes apt wait for dpkg's locks; the lists lock that `apt-get update`
# takes is not covered by it, so a run that fails naming a lock is retried
# until the time is up.
fg_apt_get() {
    local wait_s=${FG_APT_WAIT_S:-300} start=$SECONDS err rc
    err=$(mktemp)
    while :; do
        rc=0
        apt-get -o DPkg::Lock::Timeout="$wait_s" "$@" 2>"$err" || rc=$?
        if [ "$rc" != 0 ] && [ $((SECONDS - start)) -lt "$wait_s" ] &&
            grep -q "Could not get lock\|Unable to lock\|Unable to acquire" "$err"; then
            sleep 5
            continue
        fi
        cat "$err" >&2
        rm -f "$err"
        return "$rc"
    done
}

fg_need_packages() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" = 0 ]; then
        echo "installing: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        fg_apt_get update -qq && fg_apt_get install -y -qq "${missing[@]}" >/dev/null || {
            echo "apt-get install failed for: ${missing[*]}" >&2; return 1; }
    else
        echo "fulgur needs these Debian packages; run:" >&2
        echo "  sudo apt-get install -y ${missing[*]}" >&2
        return 1
    fi
}

# What the library builds against (OpenBLAS's OpenMP flavour: one threading
# runtime for OpenBLAS and fulgur's kernels; liburing for the io_uring file
# I/O of nvme offload; zlib for the gzip-compressed CSV files the data
# reader takes; OpenDHT's C wrapper, nng and libsodium for the hivemind
# strategy's DHT, messages and their authentication; libspng and
# libjpeg-turbo for the PNG and JPEG images of the image-folder reader), and
# what the tests use.
FG_BUILD_PACKAGES="libopenblas-openmp-dev libdnnl-dev libopenmpi-dev openmpi-bin libjansson-dev libprotobuf-c-dev protobuf-c-compiler libyaml-dev pkg-config liburing-dev zlib1g-dev libopendht-c-dev libnng-dev libsodium-dev libspng-dev libjpeg62-turbo-dev"
# What only the test suite needs beyond that (the formatting check; the
# fortunes text the training tests of strategy bagua and of every precision
# read: fortunes-min, and fortunes for the full demo text).
# SLURM and munge for the cluster test on namespace hosts
# (tests/hosts/test_hosts_slurm.sh starts its own daemons; skipped without them).
# The internet path of the hivemind host test (tests/hosts/shape.sh) on a
# kernel without sch_netem: iptables for the loss (statistic match) and the
# NFQUEUE rule, libnetfilter-queue-dev for tests/hosts/netdelay.c, which
# holds the queued packets for the delay; iputils-ping to measure the link.
# python3-sklearn for the 8x8 digits it ships (tests/cli/test_fit_resnet_digits.sh:
# a ResNet-20 under ddp with SyncBatchNorm to 97%; without it the test
# skipped, and a wrong convolution gradient went unseen).
FG_TEST_PACKAGES="clang-format fortunes-min fortunes slurmctld slurmd slurm-client munge iptables libnetfilter-queue-dev iputils-ping python3-sklearn"

fg_jobs() { nproc 2>/dev/null || echo 2; }
