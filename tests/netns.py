# SPDX-License-Identifier: Apache-2.0
"""Several "hosts" on one machine: network namespaces joined by veth pairs to
a bridge in the root namespace, whose address is where a broker listens.

Names carry the test process's pid and a random tag so that concurrent runs
(and leftovers of a killed one) never collide; everything is removed on exit,
also when the block fails."""

from __future__ import annotations

import os
import subprocess
import uuid
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class Namespaces:
    bridge_ip: str  # the root namespace's address on the bridge: every namespace reaches it
    names: list[str]

    def prefix(self, index: int) -> list[str]:
        """Command prefix that runs a program in namespace ``index``'s network
        only. Not `ip netns exec`: it remounts /sys, which hides tracefs and the
        cgroup hierarchy a BPF collector needs."""
        return ["nsenter", f"--net=/run/netns/{self.names[index]}"]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextmanager
def namespaces_on_a_bridge(count: int):
    pid = os.getpid()
    tag = f"js{uuid.uuid4().hex[:4]}"  # interface names: 15 characters at most
    subnet = f"10.{200 + (pid >> 8) % 50}.{pid & 255}"  # a /24 of its own per test process
    bridge = f"{tag}br"
    names = [f"{tag}-{pid}-{i}" for i in range(count)]
    created: list[str] = []
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, name in enumerate(names):
            _ip("netns", "add", name)
            created.append(name)
            _ip("link", "add", f"{tag}h{i}", "type", "veth", "peer", "name", f"{tag}n{i}")
            _ip("link", "set", f"{tag}n{i}", "netns", name)
            _ip("link", "set", f"{tag}h{i}", "master", bridge, "up")
            _ip("-n", name, "addr", "add", f"{subnet}.{i + 2}/24", "dev", f"{tag}n{i}")
            _ip("-n", name, "link", "set", f"{tag}n{i}", "up")
            _ip("-n", name, "link", "set", "lo", "up")
        yield Namespaces(f"{subnet}.1", names)
    finally:
        for i, name in enumerate(created):  # the root end first: a namespace's own goes asynchronously
            subprocess.run(["ip", "link", "del", f"{tag}h{i}"], capture_output=True)
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
