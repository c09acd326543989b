"""Rendering of the "TSDB Diagnosis" report (rule PB-MAP-2; markdown) and its JSON form.

Without a usable TSDB the report is log-only. Its texts must fit the job: "re-run with RAY=1" only when it
ran with RAY=0 (a RAY=1 job with an empty prometheus/ had a Prometheus that failed to start or never
scraped); triage's next steps are passed through except those that cannot apply: querying the TSDB that
just proved unusable, `scancel` or the Ray dashboard of a job that is no longer live, and the init-phase
("before step 0") retry advice when the log shows completed steps.

The JSON always carries the same top-level keys (analysis_type, time_window, nodes, verdict,
anomalous_hosts, findings, root_cause). In a log-only diagnosis the verdict is null: the verdicts of the
fixed set are TSDB-confirmed mechanisms and none was confirmed (triage's own class is in
job.primary_failure). time_window is the span of the log's completed steps (source "log") when the log
dates them, else null.
"""

from __future__ import annotations

from typing import Any

from jobdiagd.tsdb.engine import Diagnosis
from jobdiagd.tsdb.playbooks.base import EvidenceTable, PlaybookResult, iso, short_host


def _dur(s: float) -> str:
    s = int(s)
    h, m = divmod(s, 3600)
    m, sec = divmod(m, 60)
    return f"{h}h {m}m {sec}s" if h else (f"{m}m {sec}s" if m else f"{sec}s")


def table_dict(t: EvidenceTable) -> dict[str, Any]:
    return {"title": t.title, "query": t.query, "columns": list(t.columns), "rows": [list(r) for r in t.rows]}


def no_tsdb_root(d: Diagnosis) -> str:
    ctx = d.ctx
    cls = ctx.primary_class or "no failure"
    if ctx.ray is False:
        return f"No TSDB to confirm the log diagnosis ({cls}): the job ran with RAY=0; re-run with RAY=1 for metrics."
    return (
        f"No TSDB data to confirm the log diagnosis ({cls}): the job ran with RAY=1 but its Prometheus TSDB is "
        "empty or unusable (Prometheus failed to start or never scraped); log-only diagnosis."
    )


def no_tsdb_next_steps(d: Diagnosis) -> list[str]:
    ctx = d.ctx
    out: list[str] = []
    mid_run = ctx.last_step is not None and ctx.last_step > 0
    for s in ctx.next_steps:
        low = s.lower()
        if "prometheus tsdb" in low or "jobdiagd diagnose" in low:
            continue  # the TSDB is exactly what is missing
        if not ctx.live and ("scancel" in low or "still live" in low):
            continue  # the job has already ended
        if mid_run and "init-phase" in low:
            out.append(
                f"Retry on the same nodes first: the hang came after step {ctx.last_step} (mid-training, not during initialization); "
                "transient RCCL hangs often do not recur. If it recurs on the same nodes, exclude them."
            )
            continue
        out.append(s)
    if ctx.ray is False:
        out.append("Re-run with RAY=1 to collect a Prometheus TSDB.")
    else:
        out.append(
            "Check the job log's [Prometheus] lines (did it start, which TSDB path, port) and the prometheus/ "
            "directory: the job ran with RAY=1 but left no usable TSDB."
        )
    return out


def log_window(d: Diagnosis) -> dict[str, Any] | None:
    """The log's dated steps (up to the incident, if later) as the time window of a log-only diagnosis."""
    times = [s.time for s in d.ctx.steps if s.time is not None]
    if not times:
        return None
    lo, hi = min(times), max([*times, *([d.ctx.incident_time] if d.ctx.incident_time else [])])
    return {
        "start": iso(lo),
        "end": iso(hi),
        "start_ts": lo,
        "end_ts": hi,
        "duration_s": hi - lo,
        "source": "log",
    }


def to_json(d: Diagnosis) -> dict[str, Any]:
    ctx = d.ctx
    job = {
        "id": ctx.job_id,
        "name": ctx.job_name,
        "job_dir": str(ctx.job_dir) if ctx.job_dir else None,
        "status": ctx.status,
        "primary_failure": ctx.primary_class,
    }
    if d.no_tsdb is not None or d.result is None:
        return {
            "analysis_type": "log-only",
            "tsdb": "no TSDB",
            "reason": d.no_tsdb,
            "time_window": log_window(d),
            "nodes": {"count": len(ctx.nodes), "hosts": [short_host(n) for n in ctx.nodes]},
            "verdict": None,
            "anomalous_hosts": [],
            "findings": [
                {
                    "title": "Log-only diagnosis",
                    "summary": f"{d.no_tsdb}. Triage: status {ctx.status}, primary failure {ctx.primary_class or 'none'}.",
                    "severity": "info",
                    "hosts": [],
                    "evidence": [],
                }
            ],
            "root_cause": no_tsdb_root(d),
            "chain": [],
            "next_steps": no_tsdb_next_steps(d),
            "job": job,
        }
    r, disc = d.result, d.discovery
    assert disc is not None
    anomaly = None
    if d.anomaly is not None:
        anomaly = {
            "incident": iso(d.anomaly.incident),
            "window": [iso(d.anomaly.window[0]), iso(d.anomaly.window[1])],
            "families_checked": d.anomaly.families_checked,
            "first": [
                {
                    "family": x.family,
                    "host": x.host,
                    "onset": iso(x.onset),
                    "onset_ts": x.onset,
                    "kind": x.kind,
                    "baseline": x.baseline,
                    "value": x.value,
                    "symptom": x.symptom,
                }
                for x in d.anomaly.deviations[:20]
            ],
            "chain": d.anomaly.chain(),
        }
    chain = r.chain
    root = r.root_cause
    return {
        "analysis_type": r.analysis_type,
        "playbook": r.playbook,
        "time_window": {
            "start": iso(r.window[0]),
            "end": iso(r.window[1]),
            "start_ts": r.window[0],
            "end_ts": r.window[1],
            "duration_s": r.window[1] - r.window[0],
        },
        "nodes": {
            "count": len(disc.hosts),
            "hosts": list(disc.hosts),
            "nnodes": ctx.nnodes,
            "missing": list(disc.missing_hosts),
            "extra": list(disc.extra_hosts),
            "gpus_per_host": disc.gpus_per_host,
        },
        "verdict": r.verdict,
        "anomalous_hosts": r.anomalous_hosts,
        "findings": [
            {
                "title": f.title,
                "summary": f.summary,
                "severity": f.severity,
                "hosts": list(f.hosts),
                "evidence": [table_dict(t) for t in f.evidence],
            }
            for f in r.findings
        ],
        "root_cause": root,
        "chain": chain,
        "earliest_anomaly": anomaly,
        "next_steps": r.next_steps,
        "triage_correlation": r.triage_correlation,
        "access": {"mode": d.access_mode, "server": d.server, "notes": d.notes},
        "discovery": {
            "families": disc.families,
            "metric_count": len(disc.metric_names),
            "range": [iso(disc.min_time), iso(disc.max_time)],
            "range_source": disc.range_source,
            "targets_up": sum(1 for t in disc.targets if t[2] == 1.0),
            "targets": len(disc.targets),
            "gpu_model": disc.gpu_model,
            "crosscheck": {"status": disc.crosscheck.status, "detail": disc.crosscheck.detail},
            "steps": [disc.timeline.first_step, disc.timeline.last_step],
            "step_source": disc.timeline.source,
        },
        "queries": d.queries,
        "job": job,
    }


def md_table(t: EvidenceTable) -> list[str]:
    out = [
        f"**{t.title}**",
        f"`{t.query}`",
        "",
        "| " + " | ".join(t.columns) + " |",
        "|" + "|".join("---" for _ in t.columns) + "|",
    ]
    out += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in t.rows]
    if not t.rows:
        out.append("| " + " | ".join(["(no data)"] + [""] * (len(t.columns) - 1)) + " |")
    return out + [""]


def _no_tsdb_markdown(d: Diagnosis, where: str) -> str:
    ctx = d.ctx
    lines = [
        f"## TSDB Diagnosis: {where}",
        "",
        "**Analysis type:** log-only (no TSDB)",
        f"**Nodes:** {len(ctx.nodes)} ({', '.join(short_host(n) for n in ctx.nodes)})",
        "",
        "### Findings",
        f"no TSDB: {d.no_tsdb}.",
        no_tsdb_root(d),
        f"Log-only diagnosis from triage: status **{ctx.status}**, primary failure **{ctx.primary_class or 'none'}**.",
        "",
        "### Recommended next steps",
    ]
    steps = no_tsdb_next_steps(d)
    lines += [f"{i}. {s}" for i, s in enumerate(steps, 1)]
    return "\n".join(lines) + "\n"


def _anomalies_markdown(d: Diagnosis, r: PlaybookResult) -> list[str]:
    """The anomalous hosts, hosts only noted, and the earliest deviations of the sweep."""
    lines = ["### Anomalies detected", ", ".join(r.anomalous_hosts) if r.anomalous_hosts else "None"]
    noted = [f for f in r.findings if f.hosts and not set(f.hosts) <= set(r.anomalous_hosts)]
    for f in noted:
        lines.append(
            f"- Noted, not acted on: {', '.join(h for h in f.hosts if h not in r.anomalous_hosts)} -- {f.title}"
        )
    if d.anomaly and d.anomaly.deviations:
        lines += [
            "",
            f"Earliest deviations around {iso(d.anomaly.incident)} ({d.anomaly.families_checked} families checked):",
        ]
        lines += [f"- {x.describe()}" for x in d.anomaly.deviations[:8]]
    return lines


def to_markdown(d: Diagnosis) -> str:
    ctx = d.ctx
    where = str(ctx.job_dir or ctx.log_path or ctx.label)
    if d.result is None or d.discovery is None:
        return _no_tsdb_markdown(d, where)
    r, disc = d.result, d.discovery
    lines = [
        f"## TSDB Diagnosis: {where}",
        "",
        f"**Analysis type:** {r.analysis_type}",
        f"**Time window:** {iso(r.window[0])} to {iso(r.window[1])} ({_dur(r.window[1] - r.window[0])})",
        f"**Nodes:** {len(disc.hosts)} ({', '.join(disc.hosts)})",
        f"**Verdict:** {r.verdict}",
        f"**TSDB:** {d.access_mode} via {d.server}; range {iso(disc.min_time)} to {iso(disc.max_time)} ({disc.range_source}); "
        f"{len(disc.metric_names)} metrics ({', '.join(f'{k}*: {v}' for k, v in disc.families.items())}); "
        f"cross-check with log: {disc.crosscheck.status} ({disc.crosscheck.detail}); GPU thresholds: {disc.gpu_model}",
    ]
    for n in d.notes:
        lines.append(f"> Note: {n}")
    if disc.missing_hosts:
        lines.append(f"> Hosts in the job but not in the TSDB: {', '.join(disc.missing_hosts)}")
    lines += ["", "### Findings", r.root_cause or "No anomaly."]
    for f in r.findings:
        if f.summary and f.summary != r.root_cause:
            body = f.summary if "\n" not in f.summary else "\n```\n" + f.summary + "\n```"
            lines.append(f"- **{f.title}** ({f.severity}): {body}")
    chain = (d.anomaly.chain() if d.anomaly and d.anomaly.deviations else []) or r.chain
    if chain:
        lines += ["", "**Chain (root cause -> effects -> symptoms):**"]
        lines += [f"{i}. {c}" for i, c in enumerate(chain, 1)]
    lines += ["", "### Metric evidence", ""]
    for f in r.findings:
        for t in f.evidence:
            lines += md_table(t)
    lines += _anomalies_markdown(d, r)
    if r.triage_correlation:
        lines += ["", "### Correlation with triage", r.triage_correlation]
    lines += ["", "### Recommended next steps"]
    lines += [f"{i}. {s}" for i, s in enumerate(r.next_steps or ["No action needed."], 1)]
    return "\n".join(lines) + "\n"
