"""The words of every notice the daemon sends about itself, in one place: pure functions, no I/O.

A notice is a message not tied to an incident: a source or notifier failing and recovering, a
job's log unreadable ("monitoring blind") and readable again, a blind job leaving the watch, an
implausible step line, the state store replaced, a node suspected across jobs. Each function here returns its `Notice`; the
code where the event happens (`service.reading`, `service.discovery_feed`, `service.runner`,
`alerts.pipeline`) decides when, and queues it with `AlertPipeline.announce`.

A notice's `key` is its outbox id (`notice:<key>`): a key made again (the same episode, e.g.
`int(since)`) is never sent twice, so an episode's key names the episode, not the moment.

It lives on the alerts floor, under every caller: the pipeline's own notice (the store
quarantined) has its words here too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jobdiagd.durations import rounded_duration
from jobdiagd.model.alerts import Severity

# The end state a job without Slurm gets when its directory disappears (`pipeline.job_ended`).
JOB_DIR_GONE = "job directory gone"


@dataclass(frozen=True, slots=True)
class Notice:
    key: str
    title: str
    body: str
    severity: Severity = "info"


# -- input sources (squeue, the outputs roots) ---------------------------------------------


def source_degraded(name: str, failures: int, error: str | None, since: float) -> Notice:
    return Notice(
        f"source-degraded:{name}:{int(since)}",
        f"source degraded: {name}",
        f"`{name}` has failed {failures} times in a row: {error}\n\n"
        "Jobs already watched are still read and checked for hangs, but new jobs are not "
        "discovered and job ends are not confirmed until it answers again; the daemon will "
        "say when it does.",
        "warning",
    )


def source_recovered(name: str, since: float, now: float) -> Notice:
    return Notice(
        f"source-recovered:{name}:{int(since)}",
        f"source recovered: {name}",
        f"`{name}` answers again (degraded for {rounded_duration(now - since)}).",
    )


# -- the site Prometheus ([site_prometheus], rules SITE-6, SITE-7) ----------------------------


def site_prometheus_degraded(server: str, error: str | None, since: float) -> Notice:
    """One per episode, whatever the number of jobs asking (rule SITE-6)."""
    return Notice(
        f"site-prometheus-degraded:{int(since)}",
        "site Prometheus degraded",
        f"The site Prometheus `{server}` is not answering ({error}). GPU confirmation of hangs and "
        "the slow-host comparison are unknown until it does; hangs are still paged by the step "
        "budget. The daemon will say when it answers again.",
        "warning",
    )


def site_prometheus_recovered(server: str, since: float, now: float) -> Notice:
    return Notice(
        f"site-prometheus-recovered:{int(since)}",
        "site Prometheus recovered",
        f"The site Prometheus `{server}` answers again (not answering for {rounded_duration(now - since)}).",
    )


def site_prometheus_unusable(
    server: str, errors: Sequence[str], now: float, *, map_check: bool = True
) -> Notice:
    """The daemon runs without the site source: its metric map does not match (the start-up check,
    rule SITE-7), or its settings cannot be used (a secret that cannot be read)."""
    lines = "\n".join(f"- {e}" for e in errors[:10])
    more = f"\n- … and {len(errors) - 10} more" if len(errors) > 10 else ""
    why = "the check of its metric map failed" if map_check else "its settings cannot be used"
    fix = "the names in `[site_prometheus.metrics]`" if map_check else "`[site_prometheus]`"
    return Notice(
        f"site-prometheus-unusable:{int(now)}",
        "site Prometheus not used",
        f"`[site_prometheus]` ({server}) is not used: {why}:\n{lines}{more}\n\n"
        "Jobs without their own Prometheus get no GPU-confirmed early page and no slow-host "
        f"comparison; hangs are still paged by the step budget. Fix {fix} and restart the daemon.",
        "warning",
    )


# -- a job's files ---------------------------------------------------------------------------


def monitoring_blind(job: str, path: str, error: str | None, *, refused: bool, now: float) -> Notice:
    what = "is refused and not read" if refused else "cannot be read"
    return Notice(
        f"blind:{job}:{path}:{int(now)}",
        f"monitoring blind: job {job}",
        f"`{path}` {what} ({error}). Hang and failure detection for this job are "
        "paused until it is readable again; the daemon will say when it is.",
        "warning",
    )


def monitoring_restored(job: str, path: str, now: float) -> Notice:
    return Notice(
        f"unblind:{job}:{path}:{int(now)}",
        f"monitoring restored: job {job}",
        f"`{path}` is readable again; detection resumed.",
    )


def monitoring_ended(job: str, path: str, why: str, since: float, now: float) -> Notice:
    """The follow-up of a "monitoring blind" notice whose job leaves the watch still blind."""
    return Notice(
        f"blind-end:{job}:{path}:{int(since)}",
        f"monitoring ended: job {job}",
        f"{why[:1].upper()}{why[1:]}: the job is no longer watched, and `{path}` was "
        f"never readable again (blind for {rounded_duration(now - since)}).",
    )


def why_gone(where: object) -> str:
    """Why a job without Slurm left the watch (`monitoring_ended`'s `why`)."""
    return f"its directory `{where}` is gone"


def why_ended(state: str) -> str:
    """Why a job whose end was confirmed left the watch (`monitoring_ended`'s `why`)."""
    return f"the job ended ({state})"


def steps_ignored(job: str, step: int, why: str, kept: int | None) -> Notice:
    """The first implausible step line of a job (`model.stepguard`): one per job, ever."""
    return Notice(
        f"steps-ignored:{job}",
        f"implausible step line ignored: job {job}",
        f"A `completed step: {step}` line was read but not counted as progress: {why}. "
        f"Status and hang detection keep using step {kept if kept is not None else 'none'}; "
        "the hang clock keeps running. Later implausible step lines of this job are only logged.",
        "warning",
    )


# -- notifiers -------------------------------------------------------------------------------


def notifier_degraded(name: str, error: str, since: float, now: float) -> Notice:
    return Notice(
        f"notifier-degraded:{name}:{int(since)}",
        f"notifier degraded: {name}",
        f"Sending to `{name}` has failed for {rounded_duration(now - since)}: {error}\n\nIts pages wait in the outbox, in order, "
        "and go out when it answers again; the daemon will say when it does.",
        "warning",
    )


def notifier_recovered(name: str, since: float, now: float) -> Notice:
    return Notice(
        f"notifier-recovered:{name}:{int(since)}",
        f"notifier recovered: {name}",
        f"`{name}` accepts messages again (failing for {rounded_duration(now - since)}); "
        "what waited has been delivered, in order.",
    )


# -- the state store -------------------------------------------------------------------------


def store_quarantined(reason: str, moved: Sequence[str], now: float) -> Notice:
    return Notice(
        f"store-quarantined:{int(now)}",
        "jobdiagd state store was unreadable and has been replaced",
        f"{reason}\n\nThe file was moved aside ({', '.join(moved)}) and jobdiagd started with an empty "
        "store: incidents that were open, mutes, and notifications not yet delivered are not "
        "known to it. A condition still present is alerted again.",
        "warning",
    )


# -- suspect nodes (recovery's node memory, rule REC-22) --------------------------------------

_SUSPECT_NODE = "suspect-node"


def suspect_node(node: str, text: str, drain_command: str, noticed_at: float) -> Notice:
    """A node past the notice score: what its record says, and the line that drains it (the
    chat's Drain button runs it, for operators). One per node and episode (`noticed_at`)."""
    return Notice(
        f"{_SUSPECT_NODE}:{node}:{int(noticed_at)}",
        f"suspect node: {text}",
        f"{text}.\n\nTo take it out of scheduling:\n\n```\n{drain_command}\n```\n\n"
        f"`jobdiagd nodes` lists the jobs and evidence behind it.",
        "warning",
    )


def suspect_node_of(notification_id: str) -> str | None:
    """The node a suspect-node notice (its outbox id `notice:suspect-node:<node>:<t>`) is about;
    None for any other notification. The caller validates the name before using it."""
    head, _, rest = notification_id.partition(f"notice:{_SUSPECT_NODE}:")
    if head or not rest:
        return None
    node, sep, stamp = rest.rpartition(":")
    return node if sep and node and stamp.isdigit() else None
