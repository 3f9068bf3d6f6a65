#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Prepares a Debian host for the jitterscope collector. Idempotent: each step
# checks first and does nothing when the host already has what it needs.
#   - BCC from Debian (python3-bpfcc). PyPI's "bcc" is an unrelated package.
#   - kernel headers where BCC looks (/lib/modules/$(uname -r)/build)
#   - tracefs and debugfs mounted
set -euo pipefail

say() { printf 'host-setup: %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
    say "must run as root (apt-get, mount, /lib/modules): try 'sudo make setup'" >&2
    exit 1
fi

release=$(uname -r)
apt_updated=0
apt_install() {
    if [ "$apt_updated" -eq 0 ]; then
        apt-get update -qq
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

need=()
for pkg in python3-bpfcc python3-venv; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
    say "installing ${need[*]}"
    apt_install "${need[@]}"
fi

build="/lib/modules/$release/build"
if [ ! -e "$build/include/generated" ] && [ ! -e "$build/include/linux" ]; then
    if apt-cache show "linux-headers-$release" >/dev/null 2>&1 \
        || { apt-get update -qq && apt_updated=1 && apt-cache show "linux-headers-$release" >/dev/null 2>&1; }; then
        say "installing linux-headers-$release"
        apt_install "linux-headers-$release"
    else
        say "no linux-headers-$release in the archive; installing the distribution's generic headers"
        apt_install linux-headers-amd64
        generic=$(ls -d /usr/src/linux-headers-*-amd64 | sort -V | tail -n 1)
        common=${generic%-amd64}-common
        mkdir -p "/lib/modules/$release"
        ln -sfn "$generic" "$build"
        [ -d "$common" ] && ln -sfn "$common" "/lib/modules/$release/source"
        say "WARNING: headers for $(basename "$generic") linked for kernel $release."
        say "WARNING: only programs that read tracepoint arguments (all of jitterscope's) are safe;"
        say "WARNING: anything reading kernel structs would compile against the wrong layout."
    fi
fi

mountpoint -q /sys/kernel/tracing || { say "mounting tracefs"; mount -t tracefs tracefs /sys/kernel/tracing; }
mountpoint -q /sys/kernel/debug || { say "mounting debugfs"; mount -t debugfs debugfs /sys/kernel/debug || true; }
say "host ready (kernel $release)"
