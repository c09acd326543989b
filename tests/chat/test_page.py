"""A page that reads on a phone: the lead first, repeats dropped, a cut that says where the rest is,
late numbers dated; on a real hang finding from the engine, as Telegram's caption and Slack's blocks."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from jobdiagd.alerts.incidents import parse_finding_body
from jobdiagd.chat import slack_blocks as S
from jobdiagd.chat.incident_view import incident_message, reply_message
from jobdiagd.chat.page import LATE_AFTER_S, page
from jobdiagd.chat.telegram_html import CAPTION_LIMIT, render_single, utf16_length
from jobdiagd.model.alerts import Notification
from tests.helpers.emulators.slack import block_errors, visible_text
from tests.helpers.emulators.telegram import parse_html
from tests.helpers.engine import T0, Daemon, outbox
from tests.helpers.joblog import JobLog

NAME = "JAX-llama3.1-8b-test"


async def hang_page(tmp: Path) -> Notification:
    """The open notification of a real hang: the engine's detectors over a real log."""
    state, outputs = tmp / "state", tmp / "outputs"
    job = JobLog(outputs, "7001", NAME, checkpoint_period=10)
    d = Daemon(state, outputs)
    t = T0
    for k in range(30):
        job.step(k, seconds=10.0)
        t += 10.0
        await d.tick(t)
    for _ in range(200):  # silent until the stall budget (checkpoint phase) runs out
        t += 15.0
        await d.tick(t)
        if any(x["event"] == "open" for x in outbox(state)):
            break
    d.close()
    (n,) = [Notification.from_json(json.dumps(x)) for x in outbox(state) if x["event"] == "open"]
    return replace(n, owner="alice", incident={**(n.incident or {}), "owner": "alice"})


def lines(md: str) -> list[str]:
    return md.splitlines()


async def test_a_hang_page_leads_with_what_the_on_call_needs(short_tmp: Path) -> None:
    n = await hang_page(short_tmp)
    msg = incident_message(n, n.body, token=1, now=n.created_at, tz=UTC)
    assert msg.title == f"🔴 hang on job 7001 {NAME} (alice) [critical]"  # id, name, owner
    lead = lines(msg.body)
    assert lead[0].startswith("Training stopped advancing at step 29")  # what happened, one line
    stalled = dict(parse_finding_body(n.body).facts)["stalled for"]  # type: ignore[union-attr]
    assert msg.body.count(stalled) == 1  # stalled for: said once, by triage's line or its own
    assert lead[-2].startswith("Last step 29 vs expected ≈ ")
    assert lead[-1].startswith("**Next:** ") and len(lead) in (3, 4)
    # Facts the page would repeat are gone; the others follow the lead.
    for repeated in ("detector", "step", "status", "primary failure", "last step", "stalled for", "triage"):
        assert f"- **{repeated}**:" not in msg.more, repeated
    assert "- **next step 1**" not in msg.more and "- **next step 2**" in msg.more
    assert "- **last periodic checkpoint**: 20" in msg.more and "```text" in msg.more
    assert "no training step for" not in msg.more  # the summary only restated the lead


async def test_the_caption_fits_shows_the_lead_and_points_to_full_triage(short_tmp: Path) -> None:
    n = await hang_page(short_tmp)
    long = replace(n, body=n.body.replace("```text\n", "```text\n" + "NCCL WARN a long line\n" * 80))
    cap = render_single(incident_message(long, long.body, token=1, now=n.created_at, tz=UTC), CAPTION_LIMIT)
    shown, error = parse_html(cap)
    assert error is None and utf16_length(cap) <= CAPTION_LIMIT  # Telegram's own checks
    head = shown.splitlines()
    assert head[0].startswith("🔴 hang on job 7001") and head[1].startswith("OPEN since")
    lead = head[3 : head.index("", 3)]  # the lead, whole, before the first cut could touch it
    assert lead[0].startswith("Training stopped") and lead[-1].startswith("Next: ")
    assert shown.endswith("… (📋 Full triage has the rest)")  # never a bare "…"
    # Resolved, the page has no buttons: the pointer names the command instead.
    done = replace(long, incident={**(long.incident or {}), "resolved_at": n.created_at + 60})
    shown = parse_html(
        render_single(incident_message(done, long.body, token=1, now=n.created_at + 60), 1024)
    )[0]
    assert shown.endswith("… (the rest: triage 7001)")


async def test_numbers_made_long_before_they_are_shown_say_as_of_when(short_tmp: Path) -> None:
    n = await hang_page(short_tmp)
    fresh = incident_message(n, n.body, token=1, now=n.created_at + LATE_AFTER_S, tz=UTC)
    assert "as of" not in fresh.body
    late = incident_message(n, n.body, token=1, now=n.created_at + 300, tz=UTC)
    made = n.created_at
    hhmm = datetime.fromtimestamp(made, tz=UTC).strftime("%H:%M UTC")
    assert lines(late.body)[1].endswith(f"— as of {hhmm}")  # on the first line of numbers after it
    # A reminder that goes out late says so too; a resolution has no such numbers.
    remind = replace(n, event="remind", id=n.id.replace(":open", ":remind:1"))
    assert f"as of {hhmm}" in reply_message(remind, silent=False, now=made + 120, tz=UTC).body
    assert "as of" not in reply_message(remind, silent=False, now=made + 5, tz=UTC).body


async def test_slack_blocks_put_the_same_lead_in_a_section_of_its_own(short_tmp: Path) -> None:
    n = await hang_page(short_tmp)
    msg = incident_message(n, n.body, token=1, now=n.created_at, tz=UTC)
    _, blocks = S.render(msg, mention="<!here>")
    assert block_errors(blocks) == []
    texts = [visible_text(b["text"]["text"]) for b in blocks if b["type"] == "section"]
    assert texts[0].splitlines()[0].startswith("Training stopped advancing at step 29")
    assert texts[0].splitlines()[-1].startswith("Next: ")  # the lead alone in the first section
    assert "next step 2" in texts[1]


def test_a_body_that_is_not_a_findings_is_shown_as_it_is() -> None:
    for body in ("steps resumed at step 40 after 12 min", "`/x/log` cannot be read (EACCES).", ""):
        p = page(body, job_id="1", kind="hang")
        assert (p.lead, p.more, p.name) == (body, "", None)
    assert page("steps resumed", job_id="1", kind="hang", as_of="12:00 UTC").lead.endswith(
        "_as of 12:00 UTC_"
    )


def test_status_and_primary_failure_share_a_line_when_they_say_something() -> None:
    body = (
        "oom-host: Out of memory\n\n- **detector**: failure\n- **step**: 7\n- **status**: failed\n"
        "- **primary failure**: oom-host\n- **last step**: 7\n- **log**: /o/55-my-job/log"
    )
    p = page(body, job_id="55", kind="failure")
    assert p.lead == "oom-host: Out of memory\nLast step 7" and p.name == "my-job"
    assert p.more == "- **status**: failed · **primary failure**: oom-host\n- **log**: /o/55-my-job/log"
    assert page(body, job_id="56", kind="failure").name is None  # a log of another job names nothing


def test_a_ray_jobs_page_says_what_the_gpus_say_in_its_lead() -> None:
    body = (
        "GPU-confirmed hang (busy-wait): no training step for 4m 0s since step 90 was read; expected ≈ "
        "step 98 by now. every GPU busy-waits. Suspect host: none singled out\n\n- **detector**: hang\n"
        "- **step**: 90\n- **triage**: Training stopped advancing at step 90.\n- **last step**: 90\n"
        "- **expected step**: 98\n- **stalled for**: 4m 0s\n- **paged early**: yes\n"
        "- **suspect host**: none singled out\n- **GPU verdict**: every GPU busy-waits: RCCL/NCCL busy-wait hang\n"
        "- **next step 1**: Kill the job: scancel 7."
    )
    p = page(body, job_id="7", kind="hang")
    assert p.lead.splitlines() == [
        "Training stopped advancing at step 90.",
        "**Stalled for 4m 0s**",
        "Last step 90 vs expected ≈ 98",
        "GPUs: every GPU busy-waits: RCCL/NCCL busy-wait hang",
        "Suspect host: none singled out",
        "**Next:** Kill the job: scancel 7.",
    ]
    assert p.more == "- **paged early**: yes"  # the summary said what the lead says


def test_a_tgs_page_names_the_slow_host_with_its_evidence_in_its_lead() -> None:
    from jobdiagd.detectors.tgs import KIND as TGS

    body = (
        "TGS 3000 → 2400, -20% over steps 20–44 (constant-drop)\n\n- **detector**: tgs\n- **step**: 44\n"
        "- **pattern**: constant-drop\n- **change**: -20.0%\n"
        "- **slow host**: r003 (RDMA retransmits 13.1/s vs the other hosts' median 0/s (higher))\n"
        "- **suspect host**: r003"
    )
    p = page(body, job_id="8110", kind=TGS)
    assert p.lead.splitlines() == [
        "TGS 3000 → 2400, -20% over steps 20–44 (constant-drop)",
        "Slow host: r003 (RDMA retransmits 13.1/s vs the other hosts' median 0/s (higher))",
    ]
    assert "suspect host" not in p.more and "slow host" not in p.more  # said once, in the lead
    uniform = body.split("- **slow host**")[0] + "- **slow host**: no host stands out among 5 on GPU power"
    assert page(uniform, job_id="8111", kind=TGS).lead.splitlines()[-1] == (
        "Slow host: no host stands out among 5 on GPU power"
    )
