"""From a job's Slurm node names to an exporter's host label, and back (rule SITE-3).

Slurm's node list (squeue's `%N`, hostlist-expanded by `rules.hostlist.parse_hostlist`) names
the job's nodes; each exporter names its host in a label (`Hostname`/`hostname`, `host`, or the
scrape target `instance`, which carries a `:port`). The rewrite says how the two spellings
relate:

- `exact`: the label is the node name;
- `short` (the default): compared by their short forms, so `node001` matches a label
  `node001.cluster.example` and the other way round (FQDN <-> short name);
- `regex`: a `[pattern, replacement]` pair turns each Slurm node name into the label value
  (Python `re.fullmatch` and `\\1`-style groups), e.g. `["(.*)", "\\1.ib.example"]`.

In every mode a trailing `:port` on the label value is ignored (node_exporter's `instance`).
Only node names that pass `rules.hostlist.valid_host` reach a query, and every value is matched
literally: the regex sent to Prometheus is built from escaped names, never from raw text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from jobdiagd.rules.hostlist import valid_host
from jobdiagd.tsdb.context import short_host

RewriteMode = Literal["exact", "short", "regex"]
_RE2_META = frozenset("\\.^$|?*+()[]{}")
_PORT = re.compile(r":[0-9]{1,5}\Z")


def re2_escape(text: str) -> str:
    """`text` matched literally by RE2 (Prometheus' regex engine)."""
    return "".join("\\" + c if c in _RE2_META else c for c in text)


def promql_string(text: str) -> str:
    """`text` as the inside of a PromQL double-quoted string."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass(frozen=True)
class HostRewrite:
    mode: RewriteMode = "short"
    pattern: str = ""
    replacement: str = ""
    _compiled: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.mode == "regex":
            try:
                object.__setattr__(self, "_compiled", re.compile(self.pattern))
            except re.error as exc:
                raise ValueError(f"host_regex: not a regular expression: {exc}") from None

    def label_value(self, node: str) -> str | None:
        """What the exporter calls `node` (for `short`: the short name the label starts with);
        None when the node name is not valid or the regex does not apply to it."""
        if not valid_host(node):
            return None
        if self.mode == "exact":
            return node
        if self.mode == "short":
            return short_host(node)
        assert self._compiled is not None
        m = self._compiled.fullmatch(node)
        if m is None:
            return None
        try:
            value = m.expand(self.replacement)
        except (re.error, IndexError):
            return None
        return value if valid_host(value) else None

    def selector_regex(self, nodes: Iterable[str]) -> str:
        """The RE2 regex (not yet a PromQL string) matching the host label of exactly these nodes."""
        values = sorted({v for v in (self.label_value(n) for n in nodes) if v})
        if not values:
            raise ValueError("no valid node name to query")
        alts = "|".join(re2_escape(v) for v in values)
        domain = "(?:\\.[A-Za-z0-9-]+)*" if self.mode == "short" else ""
        return f"(?:{alts}){domain}(?::[0-9]+)?"

    def node_of(self, value: str, nodes: Sequence[str]) -> str | None:
        """The job node an exporter's host label value names, or None (not one of `nodes`)."""
        bare = _PORT.sub("", value)
        for node in nodes:
            want = self.label_value(node)
            if want is None:
                continue
            if self.mode == "short":
                if short_host(bare) == want and (bare == want or bare.startswith(want + ".")):
                    return node
            elif bare == want:
                return node
        return None


def valid_nodes(nodes: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the valid node names, the rejected ones), each in order and without repeats."""
    good: list[str] = []
    bad: list[str] = []
    for n in nodes:
        (good if valid_host(n) else bad).append(n)
    return tuple(dict.fromkeys(good)), tuple(dict.fromkeys(bad))
