# SPDX-License-Identifier: Apache-2.0
"""Where a running streams worker says how to reach it. Kept apart from
streams/app.py so that `jitterscope query` and `report`, which only need the
path, do not import Faust. Imports nothing heavy, and must stay that way."""

from __future__ import annotations

from pathlib import Path


def state_file(data_dir: Path) -> Path:
    """Where a running worker says how to reach it (for `jitterscope query`)."""
    return data_dir / "streams-worker.json"
