"""Notifications as neutral chat messages: the one message per incident (kept current), replies, reports, notices."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, tzinfo
from typing import Any

from jobdiagd.alerts.notices import suspect_node_of
from jobdiagd.chat.buttons import drain_keyboard, encode, keyboard
from jobdiagd.chat.model import RESOLVED_MARK, SEVERITY_MARK, Button, ChatMessage, Document
from jobdiagd.chat.page import LATE_AFTER_S, page
from jobdiagd.durations import rounded_duration
from jobdiagd.model.alerts import Notification
from jobdiagd.rules.hostlist import valid_host

# Bodies longer than this go as a .md document with a summary (a phone shows ~4 screens of text
# in one message; more is a file people open when they want it).
DOCUMENT_OVER = 3500


def clock_text(t: float, tz: tzinfo | None) -> str:
    dt = datetime.fromtimestamp(t, tz=tz) if tz else datetime.fromtimestamp(t).astimezone()
    return dt.strftime("%H:%M %Z").strip()


def status_line(snap: Mapping[str, Any], now: float, tz: tzinfo | None) -> str:
    """'RESOLVED after 12 min: steps resumed…' / 'OPEN 14 min · acked by alice 03:12 · muted until 04:12'."""
    opened = float(snap.get("opened_at") or now)
    resolved_at = snap.get("resolved_at")
    if resolved_at is not None:
        text = f"{RESOLVED_MARK} RESOLVED after {rounded_duration(float(resolved_at) - opened)}"
        if snap.get("resolution"):
            text += f" — {snap['resolution']}"
        return text
    parts = [f"OPEN since {clock_text(opened, tz)} ({rounded_duration(now - opened)})"]
    if snap.get("reminders_sent"):
        parts.append(f"reminders: {snap['reminders_sent']}")
    if snap.get("acked_at") is not None:
        parts.append(
            f"✔ acked by {snap.get('acked_by') or 'someone'} {clock_text(float(snap['acked_at']), tz)}"
        )
    muted_until = snap.get("muted_until")
    if isinstance(muted_until, int | float) and muted_until > now:
        by = f" by {snap['muted_by']}" if snap.get("muted_by") else ""
        parts.append(f"🔕 muted until {clock_text(float(muted_until), tz)}{by}")
    return " · ".join(parts)


def recovery_block(snap: Mapping[str, Any], tz: tzinfo | None) -> str:
    """What recovery says in the incident's message (its countdown, rule REC-14, or why it does
    nothing): the text recovery wrote (`snap["recovery"]`), a countdown with its clock time."""
    rec = snap.get("recovery")
    if not isinstance(rec, Mapping) or not isinstance(rec.get("text"), str):
        return ""
    text = str(rec["text"])
    due = rec.get("due_at")
    if rec.get("status") == "scheduled" and isinstance(due, int | float):
        head, nl, rest = text.partition("\n")
        text = f"{head} (at {clock_text(float(due), tz)}){nl}{rest}"
    return text


def incident_title(snap: Mapping[str, Any], name: str | None = None) -> str:
    mark = (
        RESOLVED_MARK
        if snap.get("resolved_at") is not None
        else SEVERITY_MARK.get(str(snap.get("severity")), "")
    )
    job = f"{snap.get('job_id')} {name}" if name else str(snap.get("job_id"))
    owner = f" ({snap['owner']})" if snap.get("owner") else ""
    sev = "" if snap.get("resolved_at") is not None else f" [{snap.get('severity')}]"
    return f"{mark} {snap.get('kind')} on job {job}{owner}{sev}".strip()


def as_of(t: Any, now: float, tz: tzinfo | None) -> str | None:
    """The clock time ("HH:MM TZ") of `t` when numbers computed then are shown more than
    LATE_AFTER_S later; else None."""
    if not isinstance(t, int | float) or now - float(t) <= LATE_AFTER_S:
        return None
    return clock_text(float(t), tz)


def cut_note(job_id: str, buttons: tuple[tuple[Button, ...], ...], token: int | None) -> str:
    """Where the rest of a cut page is: its Full triage button, else the triage command."""
    triage = encode("triage", token) if token is not None else None
    if triage is not None and any(b.token == triage for row in buttons for b in row):
        return "… (📋 Full triage has the rest)"
    return f"… (the rest: triage {job_id})"


def incident_message(
    n: Notification,
    open_body: str,
    *,
    token: int | None,
    now: float,
    tz: tzinfo | None = None,
    scancel: bool = False,
    silent: bool = False,
) -> ChatMessage:
    """The incident's own message as it should look now (sent on open, edited on every change).

    `open_body` is the body the incident was opened with (the message keeps it; the state line
    and buttons change).
    """
    snap = n.incident or {}
    job_id = str(snap.get("job_id", n.job_id))
    # The body's numbers date from the announcement (the open notification was made then).
    laid = page(open_body, job_id=job_id, kind=n.kind, as_of=as_of(snap.get("announced_at"), now, tz))
    buttons = keyboard(snap, token, now=now, scancel=scancel)
    recovery = recovery_block(snap, tz)
    return ChatMessage(
        title=incident_title(snap, laid.name),
        body=f"{laid.lead}\n\n{recovery}" if recovery else laid.lead,
        more=laid.more,
        status=status_line(snap, now, tz),
        severity=n.severity if n.event == "open" else None,
        buttons=buttons,
        silent=silent,
        footer=f"incident {n.incident_id}" if n.incident_id else "",
        cut_note=cut_note(job_id, buttons, token),
        tags=("incident",),
    )


_REPLY_LABEL = {"remind": "still open", "resolve": "resolved", "update": "update"}


def reply_message(
    n: Notification, *, silent: bool, now: float | None = None, tz: tzinfo | None = None
) -> ChatMessage:
    """A reply under the incident's message (reminder, escalation, resolution); a reminder is laid
    out like the page, its numbers dated when it goes out late (`now`: the delivery time)."""
    label = _REPLY_LABEL.get(n.event, n.event)
    if n.event == "remind" and ":escalate:" in n.id:
        label = f"escalated to {n.severity}"
    title = f"{label}: {n.title}"
    if n.event != "remind":
        return ChatMessage(title=title, body=n.body, silent=silent, tags=("reply", n.event))
    late = as_of(n.created_at, now, tz) if now is not None else None
    laid = page(n.body, job_id=n.job_id, kind=n.kind, as_of=late)
    return ChatMessage(
        title=title,
        body=laid.lead,
        more=laid.more,
        silent=silent,
        cut_note=f"… (the rest: triage {n.job_id})",
        tags=("reply", n.event),
    )


def notice_buttons(n: Notification) -> tuple[tuple[Button, ...], ...]:
    """A suspect-node notice carries its Drain button (rule REC-23); other messages none."""
    node = suspect_node_of(n.id)  # only a notice's id starts "notice:"
    return drain_keyboard(node) if node is not None and valid_host(node) else ()


def report_message(n: Notification, *, silent: bool) -> ChatMessage:
    """A report or notice; a long body goes as a .md document with its first lines as the summary."""
    if len(n.body) <= DOCUMENT_OVER:
        return ChatMessage(title=n.title, body=n.body, silent=silent, buttons=notice_buttons(n), tags=(n.event,))
    return long_report(n.title, n.body, filename=f"{_safe(n.job_id or n.kind)}-{n.kind}.md", silent=silent)


def long_report(title: str, body: str, *, filename: str, silent: bool = False) -> ChatMessage:
    return ChatMessage(
        title=title,
        body=summary_of(body),
        document=Document(filename, body if body.endswith("\n") else body + "\n"),
        silent=silent,
        tags=("report", "document"),
    )


def summary_of(markdown: str, max_chars: int = 700) -> str:
    """The first lines of a report (its status block), up to the first section after them."""
    out: list[str] = []
    size = 0
    for line in markdown.splitlines():
        if line.startswith("## ") and not out:
            continue  # the report's own title repeats the message title
        if line.startswith(("### ", "| ", "```")) and out:
            break
        if size + len(line) > max_chars:
            break
        out.append(line)
        size += len(line) + 1
    text = "\n".join(out).strip()
    return (text + "\n\n" if text else "") + "Full report attached as a file."


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:64] or "report"
