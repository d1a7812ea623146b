#!/usr/bin/env bash
# install_cluster_tools.sh -- the real launchers tests/test_cluster.py drives: Open MPI's
# mpirun, SLURM (slurmctld, slurmd, srun/sbatch) and MUNGE, from Debian's packages; and the
# monitoring tools tests/test_metrics.py checks --metrics files with: promtool (Debian's
# prometheus) and node_exporter (prometheus-node-exporter), run by the test, never as services. (The
# simulated hosts of tests/netsim.py need no package here: they are built through netlink
# by pyroute2, from the test extras.)
#
# Idempotent and quiet: when every tool is already there it says so and exits 0 without
# touching apt. Needs root (CI runs as root) or passwordless sudo. libopenmpi-dev is not
# installed: ncclbench never compiles against MPI, it only reads mpirun's variables.
#
# Package installs must not start daemons: in a container there is no init system to
# manage them, and a munged or slurmd started with Debian's default configuration would
# hold the sockets and ports the tests' own daemons need (so would a prometheus on :9090 and a
# node_exporter on :9100, whose postinst scripts start them through invoke-rc.d where no
# systemd runs). A temporary policy-rc.d (the Debian mechanism for exactly this) makes
# invoke-rc.d skip every start.
#
# Usage: scripts/ci/install_cluster_tools.sh        (exit 0 when the tools are usable)

set -euo pipefail

# command that must be on PATH -> the Debian package that provides it
declare -A PROVIDES=(
    [mpirun]=openmpi-bin
    [slurmctld]=slurmctld
    [slurmd]=slurmd
    [sbatch]=slurm-client
    [munged]=munge
    [promtool]=prometheus
    [prometheus-node-exporter]=prometheus-node-exporter
)

say() { echo "install_cluster_tools: $*"; }

missing_packages() {
    local cmd
    for cmd in "${!PROVIDES[@]}"; do
        # /usr/sbin is not on every PATH (daemons live there)
        if ! PATH="$PATH:/usr/sbin:/sbin" command -v "$cmd" > /dev/null 2>&1; then
            echo "${PROVIDES[$cmd]}"
        fi
    done | sort -u
}

mapfile -t wanted < <(missing_packages)
if [[ ${#wanted[@]} -eq 0 ]]; then
    say "already installed: mpirun, slurmctld, slurmd, sbatch, munged, promtool, prometheus-node-exporter"
    exit 0
fi

if [[ "$(id -u)" != 0 ]] && ! command -v sudo > /dev/null 2>&1; then
    say "need root (or sudo) to install: ${wanted[*]}" >&2
    exit 1
fi
as_root() {
    if [[ "$(id -u)" == 0 ]]; then "$@"; else sudo -n "$@"; fi
}
command -v apt-get > /dev/null 2>&1 || { say "no apt-get: install ${wanted[*]} by hand" >&2; exit 1; }

# Keep the package scripts from starting services (see the header); only remove a
# policy-rc.d that this script created.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee "$policy" > /dev/null
    as_root chmod 755 "$policy"
    created_policy=1
fi
cleanup() {
    if [[ "$created_policy" == 1 ]]; then
        as_root rm -f "$policy"
    fi
}
trap cleanup EXIT

apt_quiet=(-qq -o Dpkg::Use-Pty=0 -o APT::Install-Recommends=false)
log="$(mktemp)"
install_wanted() {
    as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y "${apt_quiet[@]}" "${wanted[@]}" > "$log" 2>&1
}
# Try without `apt-get update` first (fast when the lists are fresh), then refresh them.
if ! install_wanted; then
    as_root apt-get update -qq > "$log" 2>&1 || { cat "$log" >&2; exit 1; }
    install_wanted || { tail -n 30 "$log" >&2; say "apt-get install ${wanted[*]} failed" >&2; exit 1; }
fi
rm -f "$log"

mapfile -t still < <(missing_packages)
if [[ ${#still[@]} -ne 0 ]]; then
    say "installed but still missing commands from: ${still[*]}" >&2
    exit 1
fi
for pkg in "${wanted[@]}"; do
    say "installed $pkg $(dpkg-query -W -f='${Version}' "$pkg" 2> /dev/null)"
done
