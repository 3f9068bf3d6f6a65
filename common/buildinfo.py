# SPDX-License-Identifier: Apache-2.0
"""``jitterscope_build_info{version, python} 1`` on the /metrics of every
long-running process (collector, streams worker): which release a fleet runs,
joinable onto any other series (``* on(instance) group_left(version)``).
Importing this module registers it, once per process."""

from __future__ import annotations

import platform
from importlib import metadata

from prometheus_client import Info


def version() -> str:
    try:
        return metadata.version("jitterscope")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


# Info("jitterscope_build") is exposed as the gauge jitterscope_build_info{...} 1
BUILD_INFO = Info("jitterscope_build", "the jitterscope release and Python this process runs")
BUILD_INFO.info({"version": version(), "python": platform.python_version()})
