"""A page that reads on a phone: the finding's body rearranged so the first lines are what the on-call needs.

A finding's body (alerts.incidents.render_finding_body) is its summary, then every fact the
detector gave, in the detector's order, then evidence lines. On a phone the first screen is
all most people read, and Telegram cuts a photo's caption at 1024 characters, so a page is
laid out as:

- the lead: what happened in one line (the `triage` fact, else the summary), how long it is
  stalled (with the budget and phase; unless the first line says it), the last step against the expected one, what the GPUs
  say (a RAY=1 job's verdict) and the suspect host they named (a TGS slide: the slow host with
  its evidence, or why none is named), and the first next step;
- then the other facts and the evidence, which a cut may drop (Full triage and the thread
  carry them).

Facts the page would repeat are left out (rule CHAT-1 in docs/rules.md): the detector and the
step (the title names the kind; the lead has the last step), the lead's own facts, a fact whose
value the lead already says word for word (a TGS page's pattern, step range and magnitude), and the
status and primary failure when they only restate the incident's kind ("hanging", "hang");
otherwise the two are one line. A summary the lead already says (a hang's "no training step
for … since step …; expected ≈ …") is left out too.

Numbers are as of the time the body was computed. A page posted or edited more than
LATE_AFTER_S later (the outbox retried it, or an ack edits it an hour on) says "as of HH:MM"
in the chat's timezone (rule CHAT-2): they are not recomputed at delivery, because a stall may
have ended meanwhile and only the engine knows (its resolution follows in the queue).

The job's name is not part of an incident; a page takes it from a `job name` fact when a
detector gives one, else from the job's log path (`<id>-<name>/log` or `<id>-<name>.log`)
when that path names the same job id.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath

from jobdiagd.alerts.incidents import FindingBody, parse_finding_body
from jobdiagd.triage.resolve import parse_dirname
from jobdiagd.tsdb.slow_host import SLOW_HOST_FACT

LATE_AFTER_S = 60.0

# The facts the lead uses, by the label detectors write them with.
WHAT = "triage"
STALLED = "stalled for"
BUDGET = "budget"
PHASE = "phase"
LAST_STEP = "last step"
EXPECTED = "expected step"
GPUS = "GPU verdict"
SUSPECT = "suspect host"
SLOW = SLOW_HOST_FACT  # a TGS slide's host comparison (service.site_source)
NEXT = "next step 1"
NAME_FACTS = ("job name", "name")
LOG = "log"
# Shown nowhere on the page: the title or the lead already says them.
_REPEATS = {"detector", "step"}
_EMPTY = {"", "None", "none", "unknown", "n/a", "?"}


@dataclass(frozen=True, slots=True)
class Page:
    """A finding's body laid out for a phone: `lead` first, `more` below it (Markdown both)."""

    lead: str
    more: str
    name: str | None = None  # the job's name, for the title


def job_name(facts: dict[str, str], job_id: str) -> str | None:
    for label in NAME_FACTS:
        if facts.get(label, "") not in _EMPTY:
            return facts[label]
    log = facts.get(LOG, "")
    if log in _EMPTY:
        return None
    path = PurePath(log)
    for candidate in (path.stem, path.parent.name):
        jid, name, _platform = parse_dirname(candidate)
        if jid is not None and jid == job_id and name:
            return name
    return None


def _value(facts: dict[str, str], label: str) -> str | None:
    v = facts.get(label)
    return None if v is None or v.strip() in _EMPTY else v.strip()


def _stall_line(facts: dict[str, str]) -> str | None:
    stalled = _value(facts, STALLED)
    if stalled is None:
        return None
    budget, phase = _value(facts, BUDGET), _value(facts, PHASE)
    why = ([f"budget {budget}"] if budget else []) + ([f"{phase} phase"] if phase else [])
    return f"**Stalled for {stalled}**" + (f" ({', '.join(why)})" if why else "")


def _step_line(facts: dict[str, str]) -> str | None:
    last = _value(facts, LAST_STEP)
    if last is None:
        return None
    expected = _value(facts, EXPECTED)
    return f"Last step {last}" + (f" vs expected ≈ {expected}" if expected and expected != last else "")


def _lead(body: FindingBody, facts: dict[str, str], as_of: str | None) -> tuple[list[str], set[str]]:
    """The lead's lines and the labels it used."""
    used = {WHAT, STALLED, BUDGET, PHASE, LAST_STEP, EXPECTED, GPUS, SUSPECT, SLOW, NEXT}
    what = _value(facts, WHAT) or body.summary
    lines = [what]
    stalled = _value(facts, STALLED)
    # A stall the what-happened line already states (triage's hang sentence does) is not repeated.
    stall = _stall_line(facts) if stalled is None or stalled not in what else None
    numbers = [line for line in (stall, _step_line(facts)) if line]
    if as_of is not None:
        if numbers:
            numbers[0] += f" — as of {as_of}"
        else:
            lines[0] += f" (as of {as_of})"
    lines += numbers
    gpus = _value(facts, GPUS)
    if gpus is not None:
        lines.append(f"GPUs: {gpus}")
    slow = _value(facts, SLOW)
    suspect = _value(facts, SUSPECT)
    if slow is not None:
        lines.append(f"Slow host: {slow}")  # names the suspect hosts with their evidence
    elif suspect is not None:
        lines.append(f"Suspect host: {suspect}")
    nxt = _value(facts, NEXT)
    if nxt is not None:
        lines.append(f"**Next:** {nxt}")
    return lines, used


def _summary_repeats(summary: str, facts: dict[str, str]) -> bool:
    """A hang's summary says the stall and the steps the lead already gives."""
    stalled = _value(facts, STALLED)
    return stalled is not None and stalled in summary and (_value(facts, LAST_STEP) or "") in summary


# A fact whose value the lead already says word for word is a repeat (a TGS page's pattern, step
# range and magnitude are its lead line); shorter values are too common to tell a repeat.
MIN_REPEAT_CHARS = 5


def _more(
    body: FindingBody, facts: dict[str, str], used: set[str], kind: str, what_is_summary: bool, said: str
) -> str:
    lines: list[str] = []
    if not what_is_summary and not _summary_repeats(body.summary, facts):
        lines += [body.summary, ""]
    skip = used | _REPEATS | set(NAME_FACTS)
    status, primary = _value(facts, "status"), _value(facts, "primary failure")
    if primary is not None and primary == kind:
        skip |= {"status", "primary failure"}  # "hanging" / "hang": the title says it
    elif status is not None and primary is not None:
        skip |= {"status", "primary failure"}
        lines.append(f"- **status**: {status} · **primary failure**: {primary}")
    for label, value in body.facts:
        if label not in skip and not (len(value) >= MIN_REPEAT_CHARS and value in said):
            lines.append(f"- **{label}**: {value}")
    if body.evidence:
        lines += ["", "```text", *body.evidence, "```"]
    return "\n".join(lines).strip()


def page(body: str, *, job_id: str, kind: str, as_of: str | None = None) -> Page:
    """`body` laid out for a phone; a body that is not a finding's is the lead as it is.

    `as_of`: the clock time the numbers were computed, when they are stale enough to say so.
    """
    parsed = parse_finding_body(body)
    if parsed is None:
        return Page(body + (f"\n\n_as of {as_of}_" if as_of and body else ""), "")
    facts = dict(parsed.facts)
    lead, used = _lead(parsed, facts, as_of)
    what_is_summary = _value(facts, WHAT) is None
    more = _more(parsed, facts, used, kind, what_is_summary, "\n".join(lead))
    return Page("\n".join(lead), more, job_name(facts, job_id))
