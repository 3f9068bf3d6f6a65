# SPDX-License-Identifier: Apache-2.0
"""common/ports.py: a port already taken is one line naming the port, the
setting that moves it and the process holding it (from /proc)."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest

from jitterscope.common import errors, ports
from jitterscope.common.settings import Settings

# /proc/net/tcp columns: sl local_address rem_address st tx:rx tr:tm retrnsmt uid timeout inode
_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _row(sl: int, port: int, state: str, inode: int) -> str:
    return (f"   {sl}: 0100007F:{port:04X} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000"
            f"     0        0 {inode} 1 0000000000000000 100 0 0 10 0\n")


def fake_proc(tmp_path: Path, rows: list[str], holders: dict[int, tuple[str, int]]) -> Path:
    """A /proc with net/tcp ``rows`` and, per pid, its comm and one socket fd."""
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    (proc / "net" / "tcp").write_text(_HEADER + "".join(rows))
    for pid, (comm, inode) in holders.items():
        (proc / str(pid) / "fd").mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(comm + "\n")
        os.symlink(f"socket:[{inode}]", proc / str(pid) / "fd" / "3")
        os.symlink("/dev/null", proc / str(pid) / "fd" / "0")
    return proc


@pytest.fixture
def held():
    """A port this process listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield s.getsockname()[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def own_comm() -> str:
    return Path("/proc/self/comm").read_text().strip()


def test_probe_tells_a_free_port_from_a_listened_one(held):
    assert ports.probe("127.0.0.1", free_port()) is None
    assert ports.probe("127.0.0.1", held).errno == errno.EADDRINUSE
    assert ports.probe("0.0.0.0", held).errno == errno.EADDRINUSE  # a wildcard bind overlaps it


def test_probe_ignores_a_closed_connection_in_time_wait():
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = server.accept()
        conn.close()  # the server side closes first: its end waits in TIME_WAIT
        client.close()
    assert ports.probe("127.0.0.1", port) is None


def test_the_holder_is_this_process(held):
    assert ports.holder(held) == (os.getpid(), own_comm())


def test_the_holder_from_a_captured_proc(tmp_path):
    proc = fake_proc(tmp_path, [_row(0, 4318, "06", 0), _row(1, 4318, "01", 555), _row(2, 4318, "0A", 777),
                                _row(3, 9464, "0A", 888)],
                     {1234: ("tansu", 777), 99: ("curl", 555), 5: ("other", 888)})
    assert ports.listening_inodes(4318, proc) == [777, 555]  # the listener first; TIME_WAIT (inode 0) not at all
    assert ports.holder(4318, proc) == (1234, "tansu")
    assert ports.holder(6066, proc) is None


def test_an_interpreter_is_named_with_its_script(tmp_path):
    proc = fake_proc(tmp_path, [_row(0, 6066, "0A", 777)], {4321: ("python", 777)})
    (proc / "4321" / "cmdline").write_bytes(b"/usr/bin/python3\0-m\0jitterscope.cli\0streams\0")
    line = ports.taken(ports.Listener("the streams worker's web port", "streams_web_port", 6066), proc)
    assert "held by python (pid 4321: -m jitterscope.cli streams)" in line
    (proc / "4321" / "cmdline").write_bytes(b"python3\0" + b"x\x1b[31m" * 40 + b"\0")
    line = ports.taken(ports.Listener("x", "streams_web_port", 6066), proc)
    assert "\x1b" not in line and "...)" in line and "\n" not in line  # another user's bytes, cut short


def test_taken_is_one_line_with_port_setting_and_holder(tmp_path):
    proc = fake_proc(tmp_path, [_row(0, 4318, "0A", 777)], {1234: ("tansu", 777)})
    line = ports.taken(ports.Listener("the collector's OTLP receiver", "otlp_port", 4318), proc)
    assert "\n" not in line
    assert "port 4318" in line and "held by tansu (pid 1234)" in line
    assert "--set otlp_port=PORT" in line and "JITTERSCOPE_OTLP_PORT" in line
    unknown = ports.taken(ports.Listener("x", "streams_web_port", 6066), proc)
    assert "port 6066" in unknown and "ss -ltnp" in unknown and "\n" not in unknown


def test_require_free_names_every_taken_port_once(held):
    free = free_port()
    with pytest.raises(errors.PortTaken) as caught:
        ports.require_free(ports.Listener("the collector's /metrics", "collector_metrics_port", held),
                           ports.Listener("the collector's OTLP receiver", "otlp_port", free),
                           ports.Listener("the streams worker's web port", "streams_web_port", 0))
    lines = str(caught.value).splitlines()
    assert len(lines) == 1 and f"port {held} " in lines[0] and "collector_metrics_port" in lines[0]
    assert f"held by {own_comm()} (pid {os.getpid()}" in lines[0]
    ports.require_free(ports.Listener("x", "otlp_port", free), ports.Listener("y", "streams_web_port", 0))


def test_one_port_set_for_two_listeners_is_refused():
    port = free_port()
    with pytest.raises(errors.PortTaken, match=f"port {port} is set for both .*otlp_port.*streams_web_port"):
        ports.require_free(ports.Listener("a", "otlp_port", port), ports.Listener("b", "streams_web_port", port))


def test_refusing_turns_address_in_use_into_the_line(held):
    listener = ports.Listener("the collector's /metrics", "collector_metrics_port", held)
    with pytest.raises(errors.PortTaken, match=f"port {held} .*collector_metrics_port"):
        with ports.refusing(listener):
            with socket.socket() as s:
                s.bind(("127.0.0.1", held))
    with pytest.raises(PermissionError):  # anything else passes through
        with ports.refusing(listener):
            raise PermissionError(errno.EACCES, "denied")


def test_the_stack_checks_every_port_it_listens_on_before_starting(held, tmp_path):
    from jitterscope.up import Stack

    s = Settings(data_dir=tmp_path / "data", broker_port=free_port(), streams_web_port=free_port(),
                 judge_web_port=free_port(), attribute_web_port=free_port(), collector_metrics_port=free_port(),
                 otlp_port=held)
    stack = Stack(s, console=None)
    assert {(l.setting, l.port) for l in stack.listeners()} == {
        ("broker_port", s.broker_port), ("streams_web_port", s.streams_web_port), ("judge_web_port", s.judge_web_port),
        ("attribute_web_port", s.attribute_web_port), ("collector_metrics_port", s.collector_metrics_port), ("otlp_port", held)}
    with pytest.raises(errors.PortTaken, match=f"port {held} .*otlp_port"):
        stack.start()
    assert not s.data_dir.exists() and not stack.children and stack.broker is None  # nothing started
    # with a Kafka given, no embedded broker: its port is not ours to check
    assert "broker_port" not in {l.setting for l in Stack(Settings(bootstrap_servers="k:9092"), None).listeners()}


def test_the_standalone_broker_refuses_a_taken_port_in_one_line():
    import socket

    from jitterscope.broker import EmbeddedBroker
    from jitterscope.common import errors

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(errors.PortTaken) as info:
            EmbeddedBroker(port).start()
    message = str(info.value)
    assert f"port {port}" in message and "broker_port" in message and "\n" not in message
    assert f"pid {os.getpid()}" in message
