# SPDX-License-Identifier: Apache-2.0
"""Files that hold command lines are their owner's alone (common/private.py):
the data dir is 0700 whichever part makes it first, spool and state files
0600, and nothing is written through a symbolic link (recordings and
reports included)."""

from __future__ import annotations

import os
import stat
from types import SimpleNamespace

import pytest

from jitterscope.common import errors
from jitterscope.common.private import SymlinkRefused, open_private, private_dir


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_private_dir_makes_every_missing_folder_0700_and_leaves_existing_ones(tmp_path):
    (tmp_path / "shared").mkdir(mode=0o755)
    os.chmod(tmp_path / "shared", 0o755)
    made = private_dir(tmp_path / "shared" / "data" / "spool" / "h1")
    assert made.is_dir()
    assert [mode(tmp_path / "shared" / p) for p in ("data", "data/spool", "data/spool/h1")] == [0o700] * 3
    assert mode(tmp_path / "shared") == 0o755  # not ours to change
    assert private_dir(made) == made  # there already: fine
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError):
        private_dir(tmp_path / "file")


def test_open_private_creates_0600_and_tightens_an_old_file_before_writing(tmp_path):
    path = tmp_path / "state.json"
    os.close(open_private(path))
    assert mode(path) == 0o600
    path.write_text("old contents")
    path.chmod(0o644)
    fd = open_private(path)
    assert mode(path) == 0o600 and os.fstat(fd).st_size == 0
    os.close(fd)
    path.write_text("kept")
    fd = open_private(path, append=True)
    os.write(fd, b"+more")
    os.close(fd)
    assert path.read_text() == "kept+more"


def test_open_private_refuses_a_symlink_and_leaves_its_target_alone(tmp_path):
    target = tmp_path / "target"
    target.write_text("secret")
    target.chmod(0o644)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(SymlinkRefused) as refused:
        open_private(link)
    assert str(refused.value).startswith("it is a symbolic link")
    assert target.read_text() == "secret" and mode(target) == 0o644
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "would-be-created")
    with pytest.raises(SymlinkRefused):
        open_private(dangling)
    assert not (tmp_path / "would-be-created").exists()


def test_the_spool_makes_the_data_dir_0700_and_its_files_0600(tmp_path):
    from jitterscope.collector.spool import Spool

    data_dir = tmp_path / "data"
    spool = Spool(data_dir / "spool" / "h1", 1 << 20)
    assert spool.append("jitterscope.runq", b'{"x":1}\n', 1)
    assert mode(data_dir) == 0o700 and mode(data_dir / "spool") == 0o700 and mode(data_dir / "spool" / "h1") == 0o700
    files = sorted((data_dir / "spool" / "h1").iterdir())
    assert files and all(mode(f) == 0o600 for f in files), [(f.name, oct(mode(f))) for f in files]


def test_the_collectors_final_file_is_0600_in_a_0700_data_dir(tmp_path):
    from jitterscope.collector.agent import FINAL_FILE, Collector

    data_dir = tmp_path / "data"
    fake = SimpleNamespace(
        settings=SimpleNamespace(host="h1", data_dir=data_dir), stamp=SimpleNamespace(boot_id="b"), cost=None, probes=[],
        publisher=SimpleNamespace(sent_by_topic={"jitterscope.runq": 1}, undelivered=0, spooled=0))
    path = Collector.write_final(fake)
    assert path == data_dir / FINAL_FILE and mode(path) == 0o600 and mode(data_dir) == 0o700


# -- jitterscope report --out --------------------------------------------------

def report(monkeypatch, tmp_path, out):
    from typer.testing import CliRunner

    from jitterscope.cli import app
    from jitterscope.reports import capacity

    monkeypatch.setattr(capacity, "build", lambda ctx, progress=None: "<html>report</html>")
    monkeypatch.delenv("JITTERSCOPE_CONFIG", raising=False)
    return CliRunner().invoke(app, ["report", "--out", str(out), "--data-dir", str(tmp_path / "data")])


def test_report_is_written_0600(monkeypatch, tmp_path):
    out = tmp_path / "r.html"
    out.write_text("an older report")
    out.chmod(0o644)
    result = report(monkeypatch, tmp_path, out)
    assert result.exit_code == 0, result.output
    assert out.read_text() == "<html>report</html>" and mode(out) == 0o600


def test_report_refuses_an_out_that_is_a_symlink(monkeypatch, tmp_path):
    target = tmp_path / "authorized_keys"
    target.write_text("ssh-ed25519 AAAA")
    link = tmp_path / "r.html"
    link.symlink_to(target)
    result = report(monkeypatch, tmp_path, link)
    assert isinstance(result.exception, errors.BadConfig) and "is a symbolic link" in str(result.exception)
    assert target.read_text() == "ssh-ed25519 AAAA"


def test_report_does_not_follow_a_symlink_planted_after_the_check(monkeypatch, tmp_path):
    from jitterscope import reporting
    from jitterscope.reports import capacity

    target = tmp_path / "victim"
    target.write_text("keep")
    out = tmp_path / "r.html"

    def build(ctx, progress=None):  # the report takes minutes: time to swap the path for a link
        out.symlink_to(target)
        return "<html>report</html>"

    monkeypatch.setattr(capacity, "build", build)
    monkeypatch.delenv("JITTERSCOPE_CONFIG", raising=False)
    with pytest.raises(errors.BadConfig, match=f"cannot write --out {out}: it is a symbolic link"):
        reporting.report(out=out, since="7d", remediation_date=None, sets=None, config=None, clickhouse_url=None,
                         data_dir=tmp_path / "data")
    assert target.read_text() == "keep"
