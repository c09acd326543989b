"""No enum's value written out where the code compares with or tabulates its vocabulary.

The package's closed vocabularies are StrEnums (`model/kinds.py` for the shared ones, a module's
own for its own: `tsdb.playbooks.base.Verdict`, `rules.recovery.Family`...). A StrEnum equals its
value, so `status == "completed"` works -- and `status == "complted"` is silently False. The
contract this test keeps: wherever the code *compares* with a vocabulary or *tabulates* it, it
names members, never values.

What counts (a string constant equal to a member's value of any StrEnum of the package):

- a comparison: either side of `==`/`!=`, or an element of a tuple/list/set/frozenset literal on
  either side of `in`/`not in`; also `"x" in some_container`;
- a `match` case value;
- a table: a dict literal whose keys (at least two) are all such values or attributes
  (`{"hang": Family.HANG, ...}`), or a tuple/list/set/frozenset literal whose elements (at least
  two) all are (`frozenset({"running", "hanging"})`).

What does not: the members' own definitions (the enum's class body), a value passed or returned
(`Finding(..., kind)` is typed, and mypy checks it), lookups by key (`counts.get("busy-wait")`),
text for people and log events. A one-entry dict or collection is not a table (`{"tgs": ...}` is
a status column).

Another vocabulary may share a word with an enum ("none" is a stall basis, a TGS pattern and an
auth mode of the config). Such a comparison is listed in OTHER_VOCABULARIES below by module and
source text, with the vocabulary it belongs to; an entry that no longer matches fails the test, so
the list cannot rot. A vocabulary compared in code should become an enum rather than an entry.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import jobdiagd

PACKAGE = Path(jobdiagd.__file__).parent

# Literal types: mypy's strict equality rejects `==`/`!=` with a string outside the Literal.
EVENT = "a notification's event (model.alerts.Event, a Literal), not the incident kind `notice`"
AUTH = "an HTTP auth mode of the config (a Literal of config.py), not a stall basis or a pattern"
RECOVERY_STATUS = "a recovery intent's status (recovery.book.Status, a Literal), not a job's"
SEND_OUTCOME = "the dispatcher's outcome of one send (a Literal), not a job status"
# Words of the outside world or of a table keyed by other names.
LOG_TEXT = "a word looked for in a log line (a substring test), not a vocabulary value"
MAXTEXT_CONFIG = "MaxText's profiler setting as its config writes it"
GOODPUT_BY = "a grouping of `jobdiagd goodput --by` (its argparse choices)"
CHECKLIST_ARM = "a metric arm of the contention checklist (training.CHECKLIST), not a SlowdownCause"

# (module under daemon/jobdiagd, a piece of the comparison's source text) -> the vocabulary it compares.
OTHER_VOCABULARIES: dict[tuple[str, str], str] = {
    ("notifiers/alertmanager.py", 'n.event == "notice"'): EVENT,
    ("notifiers/console.py", 'n.event in ("resolve", "report", "notice", "update")'): EVENT,
    ("service/runner.py", 'n.event != "notice"'): EVENT,
    ("service/runner.py", 'n.event == "notice"'): EVENT,
    ("config.py", 'am.auth == "none"'): AUTH,
    ("config.py", 'sp.auth == "none"'): AUTH,
    ("notifiers/registry.py", 'auth == "none"'): AUTH,
    ("recovery/executor.py", 'intent.status != "running"'): RECOVERY_STATUS,
    ("recovery/manager.py", 'intent.status == "running"'): RECOVERY_STATUS,
    ("recovery/messages.py", 'intent.status == "running"'): RECOVERY_STATUS,
    ("recovery/messages.py", 'intent.status == "cancelled"'): RECOVERY_STATUS,
    ("recovery/messages.py", 'intent.status == "failed"'): RECOVERY_STATUS,
    ("notifiers/dispatcher.py", 'outcome == "failed"'): SEND_OUTCOME,
    ("logs/state.py", '"completed" in text'): LOG_TEXT,
    ("logs/state.py", '"checkpoint" in text'): LOG_TEXT,
    ("triage/progress.py", '"None", "none"'): MAXTEXT_CONFIG,
    ("goodput/report.py", 'by == "partition"'): GOODPUT_BY,
    ("tsdb/playbooks/training.py", 'arm in ("rdma", "tcp")'): CHECKLIST_ARM,
}


@dataclass(frozen=True)
class Hit:
    module: str  # under daemon/jobdiagd
    line: int
    value: str
    how: str  # "compared", "matched", "a table key", "a table member"
    source: str  # the comparison's (or table's) source text, white space collapsed

    def message(self, members: Sequence[str]) -> str:
        return f"daemon/jobdiagd/{self.module}:{self.line}: {self.value!r} {self.how}: use {' or '.join(members)}"


def _is_strenum(node: ast.ClassDef) -> bool:
    bases = {
        b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
        for b in node.bases
    }
    return "StrEnum" in bases or {"str", "Enum"} <= bases


def enums(trees: dict[str, ast.Module]) -> tuple[dict[str, list[str]], set[int]]:
    """value -> ["Enum.MEMBER" of every StrEnum having it], and the ids of the enums' class bodies."""
    members: dict[str, list[str]] = defaultdict(list)
    bodies: set[int] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and _is_strenum(node):
                bodies.add(id(node))
                for st in node.body:
                    if (
                        isinstance(st, ast.Assign)
                        and len(st.targets) == 1
                        and isinstance(st.targets[0], ast.Name)
                        and isinstance(st.value, ast.Constant)
                        and isinstance(st.value.value, str)
                    ):
                        members[st.value.value].append(f"{node.name}.{st.targets[0].id}")
    return members, bodies


def _strings(nodes: Sequence[ast.expr]) -> list[ast.Constant]:
    return [n for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _literal_collection(node: ast.AST) -> list[ast.expr] | None:
    """The elements of a tuple/list/set literal, or of `frozenset(...)`/`set(...)`/`tuple(...)` of one."""
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [e for e in node.elts if not isinstance(e, ast.Starred)]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("frozenset", "set", "tuple")
        and len(node.args) == 1
    ):
        return _literal_collection(node.args[0])
    return None


def _table(entries: Sequence[ast.expr], vocab: dict[str, list[str]]) -> list[ast.Constant]:
    """The vocabulary values of a table's keys or members: at least two entries, each a value or
    an attribute (a member already)."""
    strings = _strings(entries)
    if len(entries) < 2 or not strings:
        return []
    if all(
        isinstance(e, ast.Attribute) or (isinstance(e, ast.Constant) and e.value in vocab) for e in entries
    ):
        return strings
    return []


def _node_hits(node: ast.AST, vocab: dict[str, list[str]]) -> Iterator[tuple[ast.Constant, str, ast.AST]]:
    """(constant, how, the node whose source names it) for one node of the tree."""
    if isinstance(node, ast.Compare):
        for side in (node.left, *node.comparators):
            elts = [side] if isinstance(side, ast.Constant) else _literal_collection(side) or []
            yield from ((c, "compared", node) for c in _strings(elts))
    elif isinstance(node, ast.MatchValue):
        yield from ((c, "matched", node) for c in _strings([node.value]))
    elif isinstance(node, ast.Dict):
        keys = [k for k in node.keys if k is not None]
        yield from ((c, "a table key", node) for c in _table(keys, vocab))
    elif (elts := _literal_collection(node)) is not None:
        yield from ((c, "a table member", node) for c in _table(elts, vocab))


def scan(
    module: str, source: str, vocab: dict[str, list[str]], skip: set[int], tree: ast.Module
) -> Iterator[Hit]:
    """The hits of one module; `skip`: the enums' class bodies (their members' definitions)."""
    inside_enums = {id(n) for body in ast.walk(tree) if id(body) in skip for n in ast.walk(body)}
    seen: set[tuple[int, str]] = set()
    for node in ast.walk(tree):
        if id(node) in inside_enums:
            continue
        for c, how, owner in _node_hits(node, vocab):
            # A collection inside a comparison is met twice: as the comparison's and on its own.
            if c.value in vocab and (c.lineno, c.value) not in seen:
                seen.add((c.lineno, c.value))
                text = " ".join((ast.get_source_segment(source, owner) or "").split())
                yield Hit(module, c.lineno, c.value, how, text)


@functools.cache
def package_hits() -> tuple[list[Hit], dict[str, list[str]]]:
    sources = {
        str(p.relative_to(PACKAGE)): p.read_text(encoding="utf-8") for p in sorted(PACKAGE.rglob("*.py"))
    }
    trees = {m: ast.parse(s, filename=m) for m, s in sources.items()}
    vocab, bodies = enums(trees)
    hits = [h for m, tree in trees.items() for h in scan(m, sources[m], vocab, bodies, tree)]
    return hits, vocab


def listed(h: Hit) -> tuple[str, str] | None:
    """The entry of OTHER_VOCABULARIES that covers the hit, if any."""
    return next(((m, text) for m, text in OTHER_VOCABULARIES if m == h.module and text in h.source), None)


def test_no_enum_value_is_compared_or_tabulated_as_a_literal() -> None:
    hits, vocab = package_hits()
    wrong = [h.message(vocab[h.value]) for h in hits if listed(h) is None]
    assert wrong == [], "\n".join(["enum values written out (use the members):", *wrong])


def test_every_listed_other_vocabulary_still_matches() -> None:
    hits, _ = package_hits()
    used = {listed(h) for h in hits}
    assert [k for k in OTHER_VOCABULARIES if k not in used] == []


def test_the_vocabularies_are_found() -> None:
    _, vocab = package_hits()
    names = {m.split(".")[0] for ms in vocab.values() for m in ms}
    assert {"JobStatus", "FailureClass", "IncidentKind", "GpuState", "GpuHangState", "Verdict"} <= names
    assert "IncidentKind.HANG" in vocab["hang"] and "FailureClass.HANG" in vocab["hang"]


SAMPLE = """
from enum import StrEnum

class Color(StrEnum):
    RED = "red"
    BLUE = "blue"

def f(c, d, text):
    a = c == "red"                      # compared
    b = c in ("red", "green")           # compared (red only)
    e = "blue" in d                     # compared
    match c:
        case "red":                     # matched
            pass
    TABLE = {"red": 1, "blue": 2}       # a table key
    ONE = {"red": 1}                    # one entry: not a table
    MIXED = {"red": 1, "shape": 2}      # another word among the keys: not a table
    SET = frozenset({"red", "blue"})    # a table member
    label = f"red {c}"                  # text
    return Color("red"), d.get("red")   # passed and looked up
"""


def test_the_scan_flags_comparisons_cases_and_tables_only() -> None:
    tree = ast.parse(SAMPLE)
    vocab, bodies = enums({"sample.py": tree})
    assert vocab == {"red": ["Color.RED"], "blue": ["Color.BLUE"]}
    got = sorted((h.line, h.value, h.how) for h in scan("sample.py", SAMPLE, vocab, bodies, tree))
    assert got == [
        (9, "red", "compared"),
        (10, "red", "compared"),
        (11, "blue", "compared"),
        (13, "red", "matched"),
        (15, "blue", "a table key"),
        (15, "red", "a table key"),
        (18, "blue", "a table member"),
        (18, "red", "a table member"),
    ]
    assert Hit("x.py", 3, "red", "compared", "").message(vocab["red"]) == (
        "daemon/jobdiagd/x.py:3: 'red' compared: use Color.RED"
    )
