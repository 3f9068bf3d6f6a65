# SPDX-License-Identifier: Apache-2.0
"""The front door's `up`: the embedded broker, the stages it starts and how
they share the host, and shutdown. A section of ``Settings``
(common/settings.py); every field keeps its flat name."""

from __future__ import annotations

from pydantic import BaseModel, Field


class UpSettings(BaseModel):
    """The front door's `up`: the embedded broker, its stages and shutdown."""

    broker_port: int = Field(29092, description="port of the embedded broker (0 = pick a free one)")
    up_stages: bool = Field(
        True, description="`up` runs the streams judge apart from the attribution and store, so nothing they do "
                          "stalls an alert (off: one streams process does all, as before)")
    up_background_nice: int = Field(
        0, ge=0, le=19,
        description="the nice value `up` starts its attribution-and-store process with (not the judge, the "
                    "collector or the broker): on a host shared with an inference server it then yields its CPU to "
                    "it (bench/RESULTS.md: vllm-cost); 0 = the same as `up`")
    drain_timeout_s: float = Field(
        120.0, gt=0, description="on stop, `up` waits at most this long for the worker to store what was sent")
