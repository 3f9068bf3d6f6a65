# SPDX-License-Identifier: Apache-2.0
"""A small renderer for the subset of Helm's Go templates that
deploy/helm/jitterscope uses, for tests/unit/deploy/test_helm.py: there is no
`helm` binary on these machines, and none in the package registries they
reach. It knows actions with pipelines, ``{{-``/``-}}`` trimming, comments,
``if``/``else``/``end`` and ``define``, and the functions the chart calls:
include, toYaml, quote, nindent, indent, sha256sum, not. Anything else is
an error, not a guess: a template that needs more fails here first.

What it cannot prove is that Helm renders the chart the same way;
docs/kubernetes.md says so.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from pathlib import Path

import yaml

TAG = re.compile(r"\{\{(-\s)?\s*(.*?)\s*(\s-)?\}\}", re.S)


def _tokens(source: str) -> list[tuple[str, str]]:
    """("text", s) and ("tag", action) in order, with Helm's whitespace trimming applied."""
    out: list[tuple[str, str]] = []
    pos, trim_next = 0, False
    for match in TAG.finditer(source):
        text = source[pos:match.start()]
        if trim_next:
            text = text.lstrip()
        if match.group(1):
            text = text.rstrip()
        out.append(("text", text))
        out.append(("tag", match.group(2)))
        pos, trim_next = match.end(), bool(match.group(3))
    tail = source[pos:]
    out.append(("text", tail.lstrip() if trim_next else tail))
    return out


def _parse(tokens: list[tuple[str, str]], i: int = 0, stop: tuple[str, ...] = ()) -> tuple[list, int, str]:
    """Nodes up to a tag in ``stop`` (else, end); (nodes, next index, the tag that stopped it)."""
    nodes: list = []
    while i < len(tokens):
        kind, value = tokens[i]
        i += 1
        if kind == "text":
            nodes.append(("text", value))
            continue
        word = value.split(None, 1)[0] if value else ""
        if value.startswith("/*"):
            continue
        if word in stop:
            return nodes, i, word
        if word == "if":
            then, i, ended = _parse(tokens, i, ("else", "end"))
            other: list = []
            if ended == "else":
                other, i, _ = _parse(tokens, i, ("end",))
            nodes.append(("if", value[2:].strip(), then, other))
        elif word == "define":
            body, i, _ = _parse(tokens, i, ("end",))
            nodes.append(("define", json.loads(value.split(None, 1)[1]), body))
        elif word in ("range", "with", "template", "block", "else", "end"):
            raise NotImplementedError(f"tests/helm_render.py does not know {{{{ {value} }}}}")
        else:
            nodes.append(("action", value))
    return nodes, i, ""


class Chart:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.defines: dict[str, list] = {}
        self.templates: dict[str, list] = {}
        for template in sorted((self.path / "templates").glob("*")):
            nodes, _, _ = _parse(_tokens(template.read_text()))
            self._collect(nodes)
            if not template.name.startswith("_"):
                self.templates[template.name] = nodes

    def _collect(self, nodes: list) -> None:
        for node in nodes:
            if node[0] == "define":
                self.defines[node[1]] = node[2]

    def render(self, values: dict | None = None, namespace: str = "jitterscope") -> list[dict]:
        """The chart's objects for ``values`` over values.yaml (merged as Helm merges maps)."""
        merged = _merge(yaml.safe_load((self.path / "values.yaml").read_text()), values or {})
        root = {"Values": merged, "Release": {"Namespace": namespace, "Name": "jitterscope", "Service": "Helm"},
                "Chart": yaml.safe_load((self.path / "Chart.yaml").read_text())}
        text = "\n---\n".join(self._run(nodes, root) for nodes in self.templates.values())
        return [doc for doc in yaml.safe_load_all(text) if doc]

    def _run(self, nodes: list, dot) -> str:
        out = []
        for node in nodes:
            if node[0] == "text":
                out.append(node[1])
            elif node[0] == "action":
                out.append(_show(self._pipeline(node[1], dot)))
            elif node[0] == "if":
                out.append(self._run(node[2] if _truthy(self._pipeline(node[1], dot)) else node[3], dot))
        return "".join(out)

    def _pipeline(self, text: str, dot):
        value, first = None, True
        for command in _split_pipeline(text):
            words = shlex.split(command, posix=False)
            value = self._call(words, dot, () if first else (value,))
            first = False
        return value

    def _call(self, words: list[str], dot, piped: tuple):
        name, args = words[0], [self._value(w, dot) for w in words[1:]] + list(piped)
        functions = {
            "include": lambda n, ctx: self._run(self.defines[n], ctx),
            "toYaml": lambda v: yaml.safe_dump(v, default_flow_style=False, sort_keys=True).rstrip("\n"),
            "quote": lambda v: json.dumps(_show(v)),
            "nindent": lambda n, s: "\n" + _indent(int(n), s),
            "indent": lambda n, s: _indent(int(n), s),
            "sha256sum": lambda s: hashlib.sha256(s.encode()).hexdigest(),
            "not": lambda v: not _truthy(v),
        }
        if name in functions:
            return functions[name](*args)
        if args:
            raise NotImplementedError(f"tests/helm_render.py does not know the function {name!r}")
        return self._value(name, dot)

    @staticmethod
    def _value(word: str, dot):
        if word.startswith('"'):
            return json.loads(word)
        if word == ".":
            return dot
        if word.startswith("."):
            value = dot
            for part in word[1:].split("."):
                value = value.get(part) if isinstance(value, dict) else None
            return value
        if re.fullmatch(r"-?\d+", word):
            return int(word)
        if word in ("true", "false"):
            return word == "true"
        raise NotImplementedError(f"tests/helm_render.py does not know the word {word!r}")


def _split_pipeline(text: str) -> list[str]:
    parts, current, quoted = [], "", False
    for c in text:
        if c == '"':
            quoted = not quoted
        if c == "|" and not quoted:
            parts.append(current.strip())
            current = ""
        else:
            current += c
    return [*parts, current.strip()]


def _indent(n: int, text: str) -> str:
    return "\n".join(" " * n + line for line in str(text).split("\n"))


def _truthy(value) -> bool:
    return bool(value) and value != 0


def _show(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
