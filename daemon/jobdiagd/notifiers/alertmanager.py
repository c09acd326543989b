"""Alertmanager notifier: incidents and the daemon's own trouble as alerts on every instance's v2 API.

Decisions (the issue names the labels; the rest is written down here):

- **Identity is the label set**, built only from what stays fixed for an incident's life and is
  the same in every daemon watching the same jobs: `alertname` (`Jobdiagd` + the kind in
  CamelCase: JobdiagdHang, JobdiagdFailure, JobdiagdTgsDegradation), `cluster` (config), `job_id`,
  `kind`, `severity`, `owner` (the Slurm user, when known; absent otherwise) and
  `source="jobdiagd"`. No incident id, host, counter or time: two daemons of an HA pair post the
  same alert and Alertmanager deduplicates it. `job_id`, not `job`, which is Prometheus's scrape
  job in every route tree. Text goes in annotations: `summary`, `description` (the triage, cut at
  4000 characters), `incident_id`, `runbook_url`, `acknowledged_by`.
- **Firing alerts carry `endsAt` = post time + 4 x the resend interval** (Prometheus's rule) and
  are re-posted every interval by `resync`, so they never resolve by themselves while the
  incident lasts, whatever the Alertmanager's `resolve_timeout`, and do resolve within four
  intervals if the daemon dies (the optional JobdiagdWatchdog alert is the dead man's switch).
- **The store is the truth.** `send` posts the stored incident's *current* state (looked up by
  id), not the message's: a late "open" of an incident that has since resolved posts it
  resolved, and retries are idempotent. `resync` re-posts every open incident people were told
  about, from the incident book, so a restarted daemon goes on re-posting without a file of its
  own. One lock orders `send` and `resync`: a re-post never lands after, and undoes, a resolve.
- **Resolves go through the outbox** (a failed POST is retried by the dispatcher): `endsAt` =
  the resolution time, `startsAt` = the incident's opening. An incident that resolves unannounced
  (muted, `notify_resolve = false`) is resolved by the next resync; after a restart it expires.
- **A severity change changes the identity**: the old label set is posted resolved in the same
  request (known from what this process posted; after a restart it expires). Route warning and
  critical differently and inhibit warning by critical on `[alertname, cluster, job_id]`.
- **jobdiagd mutes do not stop re-posting** (the alert would "resolve" while the job still
  hangs): silence in Alertmanager. Incidents opened while muted are posted once announced.
- **Not every message is an alert.** Job-end reports are events, not conditions: not posted.
  Notices (log unreadable, restored, ...) trigger an early resync: the daemon's own trouble is
  posted as state (JobdiagdSourceFailing, JobdiagdMonitoringBlind, JobdiagdNotifierFailing,
  JobdiagdUnhealthy) from what `jobdiagd status` shows, with an `instance` label (it is this
  daemon's problem, not the pair's), and resolves when that state clears.
- **Delivered = accepted by at least one instance.** HA peers do not share alerts, but the next
  resync brings a late instance up to date and a missed resolve expires there. Content
  rejections (400, 413, 422, ...) fail this message for good; 401/403/404/408/429 and other
  destination trouble, 5xx, network errors and timeouts are retried: a rotated token must delay
  pages, not drop them. Redirects are not followed (credentials stay on the configured host).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import aiohttp
import structlog

from jobdiagd import __version__, clock
from jobdiagd.model.alerts import SEVERITIES, DaemonCondition, Incident, Notification
from jobdiagd.notifiers.base import CurrentState, NotifierError

SOURCE = "jobdiagd"
API_PATH = "/api/v2/alerts"
LIFETIME_INTERVALS = 4
MAX_SUMMARY = 300
MAX_DESCRIPTION = 4000
MAX_ERROR_TEXT = 300
# Destination trouble (auth, wrong path, rate limit), not this message's: retried.
RETRYABLE_4XX = frozenset({401, 403, 404, 405, 407, 408, 409, 421, 425, 429})

Labels = dict[str, str]
Alert = dict[str, Any]
IncidentLookup = Callable[[str], Incident | None]


@dataclass(frozen=True)
class AlertOptions:
    """What every alert of one daemon shares (from [notifiers.alertmanager])."""

    cluster: str
    instance: str
    resend_interval: float = 60.0
    runbook_url: str = ""
    generator_url: str = ""
    watchdog: bool = False

    @property
    def lifetime(self) -> float:
        return LIFETIME_INTERVALS * self.resend_interval


# ---------------------------------------------------------------- pure: alerts from plain data


def alert_name(kind: str) -> str:
    """'hang' -> 'JobdiagdHang', 'tgs-degradation' -> 'JobdiagdTgsDegradation'."""
    parts = [p for p in re.split(r"[^A-Za-z0-9]+", kind) if p]
    return "Jobdiagd" + "".join(p[:1].upper() + p[1:] for p in parts)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def cut(text: str, limit: int) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    note = f"\n… (cut at {limit} of {len(text)} characters)"
    return text[: limit - len(note)].rstrip() + note


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def _fill(template: str, **values: str) -> str:
    # Config validation checked the placeholders; a value cannot inject one (format is one pass).
    return template.format(**values) if template else ""


def incident_labels(inc: Incident, opts: AlertOptions) -> Labels:
    labels = {
        "alertname": alert_name(inc.kind),
        "cluster": opts.cluster,
        "job_id": inc.job_id,
        "kind": inc.kind,
        "severity": inc.severity,
        "source": SOURCE,
    }
    if inc.owner:
        labels["owner"] = inc.owner
    return labels


def incident_alert(inc: Incident, text: Notification | None, opts: AlertOptions, now: float) -> Alert:
    """The postable alert for an incident's current state; `text`: its newest open/remind message."""
    labels = incident_labels(inc, opts)
    what = f"{inc.kind} on job {inc.job_id}"
    if inc.is_open:
        body = text.body if text is not None and text.body.strip() else inc.summary
        summary = f"{what}: {_first_line(body) or inc.summary}"
    else:
        body = inc.resolution or "resolved"
        summary = f"{what} resolved: {_first_line(body)}"
    annotations = {
        "summary": cut(summary, MAX_SUMMARY),
        "description": cut(body, MAX_DESCRIPTION),
        "incident_id": inc.id,
    }
    fill = {"alertname": labels["alertname"], "cluster": opts.cluster, "job_id": inc.job_id, "kind": inc.kind}
    if opts.runbook_url:
        annotations["runbook_url"] = _fill(opts.runbook_url, **fill)
    if inc.acked_at is not None:
        annotations["acknowledged_by"] = f"{inc.acked_by or 'someone'} at {iso(inc.acked_at)}"
    ends = now + opts.lifetime if inc.is_open else max(inc.resolved_at or now, inc.opened_at)
    alert: Alert = {
        "labels": labels,
        "annotations": annotations,
        "startsAt": iso(inc.opened_at),
        "endsAt": iso(ends),
    }
    if opts.generator_url:
        alert["generatorURL"] = _fill(opts.generator_url, **fill)
    return alert


def condition_labels(c: DaemonCondition, opts: AlertOptions) -> Labels:
    labels = {
        "alertname": alert_name(c.name),
        "cluster": opts.cluster,
        "instance": opts.instance,
        "severity": c.severity,
        "source": SOURCE,
    }
    if c.job_id:
        labels["job_id"] = c.job_id
    if c.component:
        labels["component"] = c.component
    return labels


def condition_alert(c: DaemonCondition, opts: AlertOptions, now: float) -> Alert:
    labels = condition_labels(c, opts)
    annotations = {"summary": cut(c.summary, MAX_SUMMARY)}
    if c.description:
        annotations["description"] = cut(c.description, MAX_DESCRIPTION)
    if opts.runbook_url:
        annotations["runbook_url"] = _fill(
            opts.runbook_url,
            alertname=labels["alertname"],
            cluster=opts.cluster,
            job_id=c.job_id or "",
            kind=c.name,
        )
    starts = min(c.since, now) if c.since is not None else now
    return {
        "labels": labels,
        "annotations": annotations,
        "startsAt": iso(starts),
        "endsAt": iso(now + opts.lifetime),
    }


def watchdog_alert(opts: AlertOptions, now: float) -> Alert:
    labels = {
        "alertname": "JobdiagdWatchdog",
        "cluster": opts.cluster,
        "instance": opts.instance,
        "severity": "none",
        "source": SOURCE,
    }
    summary = f"jobdiagd on {opts.instance} is alive (always firing: page when it stops arriving)"
    return {
        "labels": labels,
        "annotations": {"summary": summary},
        "startsAt": iso(now),
        "endsAt": iso(now + opts.lifetime),
    }


def resolved_alert(labels: Labels, starts_at: float, ends_at: float) -> Alert:
    return {"labels": labels, "startsAt": iso(starts_at), "endsAt": iso(max(starts_at, ends_at))}


def rejected_for_good(status: int) -> bool:
    """A failed POST's status says this message will never be accepted (do not retry it)."""
    return 400 <= status < 500 and status not in RETRYABLE_4XX


def incident_from_notification(n: Notification) -> Incident:
    """Best effort when the store has no record of `n`'s incident (render, or a damaged store)."""
    resolved = n.event == "resolve"
    return Incident(
        id=n.incident_id or n.id,
        job_id=n.job_id,
        kind=n.kind,
        seq=0,
        detector="",
        severity=n.severity,
        summary=_first_line(n.body) or n.title,
        opened_at=n.created_at,
        last_seen_at=n.created_at,
        resolved_at=n.created_at if resolved else None,
        resolution=n.body if resolved else None,
    )


# ---------------------------------------------------------------- the notifier


@dataclass(frozen=True)
class _Entry:
    """One alert of a post round, keyed so the next round can tell what changed or went away."""

    key: str
    labels: Labels
    alert: Alert
    starts_at: float
    firing: bool


@dataclass(frozen=True)
class _Posted:
    labels: Labels
    starts_at: float


@dataclass(frozen=True)
class _Outcome:
    url: str
    ok: bool
    permanent: bool = False
    error: str = ""


class AlertmanagerNotifier:
    """Posts to every configured instance; `send` for the outbox, `resync` for the periodic re-post."""

    name = "alertmanager"

    def __init__(
        self,
        urls: Sequence[str],
        options: AlertOptions,
        *,
        timeout: float = 4.0,
        authorization: str | None = None,
        lookup: IncidentLookup | None = None,
        now: Callable[[], float] = clock.wall,
    ) -> None:
        if not urls:
            raise ValueError("an Alertmanager notifier needs at least one URL")
        self.urls = tuple(u.rstrip("/") + API_PATH for u in urls)
        self.options = options
        self.timeout = timeout
        self._authorization = authorization  # an Authorization header value; never logged or shown
        self._lookup = lookup
        self._now = now
        self._lock = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None
        self._posted: dict[str, _Posted] = {}
        self._failing: dict[str, str] = {}
        self._resync_wanted = asyncio.Event()
        self._log = structlog.get_logger("jobdiagd", component="alertmanager")

    def __repr__(self) -> str:
        return f"AlertmanagerNotifier(urls={list(self.urls)!r}, cluster={self.options.cluster!r})"

    # -- StateMirror -------------------------------------------------------

    @property
    def resync_interval(self) -> float:
        return self.options.resend_interval

    @property
    def resync_wanted(self) -> asyncio.Event:
        return self._resync_wanted

    def attach(self, lookup: IncidentLookup) -> None:
        self._lookup = lookup

    async def resync(self, state: Callable[[], CurrentState]) -> bool:
        """Post everything that is true now (and resolve what no longer is) to every instance.

        Never raises for a failing Alertmanager (logged once per outage); True when at least one
        instance accepted the round.
        """
        self._resync_wanted.clear()
        async with self._lock:
            now = self._now()
            snap = state()
            opts = self.options
            entries = [
                _Entry(
                    f"incident:{inc.id}",
                    incident_labels(inc, opts),
                    incident_alert(inc, text, opts, now),
                    inc.opened_at,
                    inc.is_open,
                )
                for inc, text in snap.incidents
            ]
            for c in snap.conditions:
                alert = condition_alert(c, opts, now)
                key = f"condition:{c.name}:{c.job_id or ''}:{c.component or ''}"
                entries.append(_Entry(key, alert["labels"], alert, min(c.since or now, now), True))
            if opts.watchdog:
                alert = watchdog_alert(opts, now)
                entries.append(_Entry("watchdog", alert["labels"], alert, now, True))
            current = {e.key for e in entries}
            gone = [k for k in self._posted if k not in current]
            alerts = self._with_superseded(entries, now) + [self._retired(k, now) for k in gone]
            if not alerts:
                return True
            outcomes = await self._post_everywhere(alerts)
            # A content rejection will not get better by posting again: count it as done.
            if not any(o.ok or o.permanent for o in outcomes):
                return False
            self._commit(entries)
            for k in gone:
                self._posted.pop(k, None)
            return any(o.ok for o in outcomes)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- Notifier ------------------------------------------------------------

    def render(self, notification: Notification) -> str:
        """The JSON this notification posts ("[]": nothing), from the message alone."""
        n = notification
        if n.incident_id is None:
            return "[]"
        inc = incident_from_notification(n)
        text = n if n.event in ("open", "remind") else None
        return json.dumps(
            [incident_alert(inc, text, self.options, n.created_at)], indent=2, ensure_ascii=False
        )

    async def send(self, notification: Notification) -> None:
        n = notification
        if n.incident_id is None:
            if n.event == "notice":
                self._resync_wanted.set()  # the daemon's own trouble is posted as state by resync
            return  # job-end reports are events, not alerts
        async with self._lock:
            now = self._now()
            inc = self._lookup(n.incident_id) if self._lookup is not None else None
            if inc is None:
                inc = self._guess(n)
            text = n if n.event in ("open", "remind") else None
            entry = _Entry(
                f"incident:{inc.id}",
                incident_labels(inc, self.options),
                incident_alert(inc, text, self.options, now),
                inc.opened_at,
                inc.is_open,
            )
            outcomes = await self._post_everywhere(self._with_superseded([entry], now))
            if not any(o.ok for o in outcomes):
                detail = "; ".join(f"{o.url}: {o.error}" for o in outcomes)
                raise NotifierError(f"alertmanager: {detail}", permanent=all(o.permanent for o in outcomes))
            self._commit([entry])

    # -- internals -----------------------------------------------------------

    def _guess(self, n: Notification) -> Incident:
        self._log.warning("incident_not_in_store", incident=n.incident_id, notification=n.id)
        inc = incident_from_notification(n)
        posted = self._posted.get(f"incident:{inc.id}")
        severity = posted.labels.get("severity") if posted is not None else None
        if posted is not None and severity in SEVERITIES:
            # A resolve message says "info"; the alert it ends was posted with the incident's severity.
            inc = replace(inc, severity=severity, opened_at=posted.starts_at)
        return inc

    def _with_superseded(self, entries: Iterable[_Entry], now: float) -> list[Alert]:
        """The entries' alerts, plus the old label set of any whose labels changed, posted resolved."""
        out: list[Alert] = []
        for e in entries:
            out.append(e.alert)
            old = self._posted.get(e.key)
            if old is not None and old.labels != e.labels:
                out.append(resolved_alert(old.labels, old.starts_at, now))
        return out

    def _retired(self, key: str, now: float) -> Alert:
        old = self._posted[key]
        ends = now
        if key.startswith("incident:") and self._lookup is not None:
            inc = self._lookup(key.removeprefix("incident:"))
            if inc is not None and inc.resolved_at is not None:
                ends = inc.resolved_at
        return resolved_alert(old.labels, old.starts_at, ends)

    def _commit(self, entries: Iterable[_Entry]) -> None:
        for e in entries:
            if e.firing:
                self._posted[e.key] = _Posted(e.labels, e.starts_at)
            else:
                self._posted.pop(e.key, None)

    def _session_(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"User-Agent": f"jobdiagd/{__version__}", "Content-Type": "application/json"}
            if self._authorization:
                headers["Authorization"] = self._authorization
            self._session = aiohttp.ClientSession(
                headers=headers, timeout=aiohttp.ClientTimeout(total=self.timeout)
            )
        return self._session

    async def _post_everywhere(self, alerts: list[Alert]) -> list[_Outcome]:
        # ASCII escapes: a lone surrogate from a badly decoded log line cannot break the encoding.
        body = json.dumps(alerts).encode()
        session = self._session_()
        outcomes = await asyncio.gather(*(self._post_one(session, url, body) for url in self.urls))
        for o in outcomes:
            self._edge(o)
        return list(outcomes)

    async def _post_one(self, session: aiohttp.ClientSession, url: str, body: bytes) -> _Outcome:
        try:
            async with session.post(url, data=body, allow_redirects=False) as resp:
                if 200 <= resp.status < 300:
                    return _Outcome(url, True)
                text = " ".join((await resp.text(errors="replace")).split())[:MAX_ERROR_TEXT]
                permanent = rejected_for_good(resp.status)
                where = f" to {resp.headers.get('Location', '?')}" if 300 <= resp.status < 400 else ""
                return _Outcome(url, False, permanent, f"HTTP {resp.status}{where}: {text}".rstrip(": "))
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return _Outcome(url, False, False, error)

    def _edge(self, o: _Outcome) -> None:
        """Log an instance once when it starts failing and once when it is back."""
        if o.ok:
            if self._failing.pop(o.url, None) is not None:
                self._log.info("alertmanager_recovered", url=o.url)
        elif o.url not in self._failing:
            self._failing[o.url] = o.error
            self._log.warning("alertmanager_failing", url=o.url, error=o.error)

    def snapshot(self) -> Mapping[str, Any]:
        """For tests and status: what this process believes is firing, and failing instances."""
        return {"firing": sorted(self._posted), "failing": dict(self._failing)}
