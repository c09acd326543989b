"""Notifications as neutral chat messages: the one message per incident (kept current), replies, reports, notices."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, tzinfo
from typing import Any

from jobdiagd.chat.buttons import keyboard
from jobdiagd.chat.model import RESOLVED_MARK, SEVERITY_MARK, ChatMessage, Document
from jobdiagd.durations import rounded_duration
from jobdiagd.model.alerts import Notification

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


def incident_title(snap: Mapping[str, Any]) -> str:
    mark = (
        RESOLVED_MARK
        if snap.get("resolved_at") is not None
        else SEVERITY_MARK.get(str(snap.get("severity")), "")
    )
    owner = f" ({snap['owner']})" if snap.get("owner") else ""
    sev = "" if snap.get("resolved_at") is not None else f" [{snap.get('severity')}]"
    return f"{mark} {snap.get('kind')} on job {snap.get('job_id')}{owner}{sev}".strip()


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
    return ChatMessage(
        title=incident_title(snap),
        body=open_body,
        status=status_line(snap, now, tz),
        severity=n.severity if n.event == "open" else None,
        buttons=keyboard(snap, token, now=now, scancel=scancel),
        silent=silent,
        footer=f"incident {n.incident_id}" if n.incident_id else "",
        tags=("incident",),
    )


_REPLY_LABEL = {"remind": "still open", "resolve": "resolved", "update": "update"}


def reply_message(n: Notification, *, silent: bool) -> ChatMessage:
    """A reply under the incident's message (reminder, escalation, resolution)."""
    label = _REPLY_LABEL.get(n.event, n.event)
    if n.event == "remind" and ":escalate:" in n.id:
        label = f"escalated to {n.severity}"
    return ChatMessage(title=f"{label}: {n.title}", body=n.body, silent=silent, tags=("reply", n.event))


def report_message(n: Notification, *, silent: bool) -> ChatMessage:
    """A report or notice; a long body goes as a .md document with its first lines as the summary."""
    if len(n.body) <= DOCUMENT_OVER:
        return ChatMessage(title=n.title, body=n.body, silent=silent, tags=(n.event,))
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
