# SPDX-License-Identifier: Apache-2.0
"""Per-token objectives beside the whole-request SLO (issue 37, item 2): a
chat user waits for the first token, then reads as the rest stream in, so a
vLLM operator's objectives are the time to first token (TTFT) and the time
between tokens (inter-token latency, ITL), per model. Settings
``ttft_slo_ms`` and ``itl_slo_ms`` map model names (shell patterns, ``*``
for any; the exact name wins, then the first pattern that matches) to
milliseconds. A request over either gets it in
``RequestAttribution.token_slo_breached`` ("ttft", "itl") and raises
``request_slo`` (streams/rules/requests.py), whose line then says which
cause took which phase (streams/phases.py): per-phase answers are given to
the requests that broke an objective, whole or per token (each phase is
attributed again: they cost several times a request's attribution)."""

from __future__ import annotations

from fnmatch import fnmatchcase


def objective_ns(objectives: dict[str, float], model: str) -> int:
    """The objective (ns) for ``model``; 0 where none applies."""
    if model in objectives:
        return int(objectives[model] * 1e6)
    return next((int(ms * 1e6) for pattern, ms in objectives.items() if fnmatchcase(model, pattern)), 0)


class TokenObjectives:
    """A model's token objectives, judged as each request is attributed (streams/attribution.py)."""

    def __init__(self, ttft_ms: dict[str, float], itl_ms: dict[str, float]):
        self.ttft_ms, self.itl_ms = dict(ttft_ms), dict(itl_ms)
        self._of: dict[str, tuple[int, int]] = {}  # model -> (ttft, itl) ns: a fleet serves few models

    @classmethod
    def from_settings(cls, s) -> "TokenObjectives":
        return cls(s.ttft_slo_ms, s.itl_slo_ms)

    def of(self, model: str) -> tuple[int, int]:
        """(TTFT, ITL) objectives of ``model`` in ns, 0 for none."""
        if model not in self._of:
            if len(self._of) >= 10_000:  # model names come from spans: bound what they can grow
                self._of.clear()
            self._of[model] = (objective_ns(self.ttft_ms, model), objective_ns(self.itl_ms, model))
        return self._of[model]

    def broken(self, model: str, ttft_ns: int, itl_ns: int) -> list[str]:
        """The objectives a request of ``model`` broke: "ttft", "itl" ([] for none)."""
        if not (self.ttft_ms or self.itl_ms):
            return []
        ttft, itl = self.of(model)
        return [name for name, took, limit in (("ttft", ttft_ns, ttft), ("itl", itl_ns, itl)) if limit and took > limit]
