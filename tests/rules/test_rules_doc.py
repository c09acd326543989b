"""docs/rules.md and the code agree: every cited rule id exists, every id is defined once."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from jobdiagd.rules.signatures import ALL_CLASSES, FAMILIES, HARMLESS

ROOT = Path(__file__).resolve().parents[2]
RULES_MD = ROOT / "docs" / "rules.md"
SCANNED = (ROOT / "daemon", ROOT / "tests")
SUFFIXES = {".py", ".md", ".toml", ".txt"}

ID = r"[A-Z][A-Z0-9]*(?:-[A-Za-z0-9]+)+"
# An id is defined in rules.md as a backticked token (first column of a table row, or a
# signature family / harmless id in its class's row).
DEFINITION = re.compile(rf"`({ID})`")
# A citation: "rule HANG-2", "rules CAS-1, HB-3", "rules PRJ-3 and PRJ-9", "rule ST-4/ST-5".
CITATION = re.compile(rf"\b[Rr]ules? ({ID}(?:(?:, | and | or |/){ID})*)")


def defined_ids(text: str) -> Counter[str]:
    return Counter(DEFINITION.findall(text))


def cited_ids(text: str) -> set[str]:
    return {i for group in CITATION.findall(text) for i in re.findall(ID, group)}


def citations_in_repo() -> dict[str, set[str]]:
    """Rule id -> the files (relative paths) citing it, over daemon/, tests/ and rules.md itself."""
    out: dict[str, set[str]] = {}
    files = [p for base in SCANNED for p in base.rglob("*") if p.is_file() and p.suffix in SUFFIXES]
    for path in [*files, RULES_MD]:
        for rule in cited_ids(path.read_text(encoding="utf-8", errors="replace")):
            out.setdefault(rule, set()).add(str(path.relative_to(ROOT)))
    return out


def test_every_rule_id_is_defined_once() -> None:
    counts = defined_ids(RULES_MD.read_text(encoding="utf-8"))
    assert counts, "no rule ids found in docs/rules.md"
    twice = sorted(i for i, n in counts.items() if n > 1)
    assert not twice, f"ids defined more than once in docs/rules.md: {twice}"


def test_every_cited_rule_id_exists() -> None:
    defined = set(defined_ids(RULES_MD.read_text(encoding="utf-8")))
    cited = citations_in_repo()
    assert cited, "no rule citations found: the citation pattern or the scan is broken"
    missing = {rule: sorted(where) for rule, where in cited.items() if rule not in defined}
    assert not missing, f"rule ids cited but not defined in docs/rules.md: {missing}"


def test_signature_families_and_classes_are_documented() -> None:
    defined = set(defined_ids(RULES_MD.read_text(encoding="utf-8")))
    families = set(FAMILIES) | {h.rule for h in HARMLESS}
    assert sorted(families - defined) == []
    classes = {f"CL-{c.upper()}" for c in ALL_CLASSES}
    assert sorted(classes - defined) == []


def test_a_citation_of_a_missing_id_is_caught() -> None:
    # Built at run time so this file does not itself cite an undefined id.
    text = "see (" + "rule " + "NOPE-7" + ", docs/rules.md) and rules HANG-1, " + "ZZ-1"
    defined = set(defined_ids(RULES_MD.read_text(encoding="utf-8")))
    assert cited_ids(text) == {"NOPE-7", "HANG-1", "ZZ-1"}
    assert cited_ids(text) - defined == {"NOPE-7", "ZZ-1"}


def test_runbook_copies_are_in_the_repo() -> None:
    for name in ("job-log-triage.md", "tsdb-diagnosis.md"):
        text = (ROOT / "docs" / "runbooks" / name).read_text(encoding="utf-8")
        assert text.splitlines()[0].startswith("> Upstream specification")
