"""The site source as the daemon holds it (service/site_source.py), without a Prometheus: start-up
refusals, the unchecked map of a server that does not answer, placement from Slurm (scontrol
once per job), the TGS page held one tick for its slow host, and one notice per episode. A real
Prometheus answers in tests/service/test_site_daemon.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from jobdiagd.alerts.incidents import IncidentBook
from jobdiagd.alerts.notices import Notice
from jobdiagd.config import Config, IncidentsConfig, loads
from jobdiagd.detectors.tgs import KIND as TGS
from jobdiagd.model.alerts import Finding
from jobdiagd.model.jobref import JobRef
from jobdiagd.model.kinds import GpuHangState
from jobdiagd.service.host_compare import SlowHostHold, fact_text, slow_host_text
from jobdiagd.service.jobs import JobView
from jobdiagd.service.site_source import RECHECK_S, SiteJobs, open_site
from jobdiagd.sources.slurm import SlurmCommandError
from jobdiagd.sources.slurm_parse import SlurmJob
from jobdiagd.tsdb.access import SshTunnelPool, free_loopback_port
from jobdiagd.tsdb.context import DiagnosisContext
from jobdiagd.tsdb.settings import TsdbSettings
from jobdiagd.tsdb.site import SlideAnswer, SlowHostResult
from jobdiagd.tsdb.slow_host import SlowHostVerdict

T0 = 1_780_000_000.0
DETAIL = (
    "JobId={job} JobName=x UserId=alice(1000) JobState=RUNNING NodeList=s[001-002] OverSubscribe=OK "
    "Nodes=s001 CPU_IDs=0-15 Mem=0 GRES=gpu:8(IDX:0-7) Nodes=s002 CPU_IDs=0-7 Mem=0 GRES=gpu:4(IDX:4-7)"
)


def cfg_for(url: str, **site: object) -> Config:
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in site.items())
    return loads(f'[site_prometheus]\nenabled = true\nurl = "{url}"\n{extra}')


def down_url() -> str:
    return f"http://127.0.0.1:{free_loopback_port()}"  # nothing listens there


def view(key: str, nodes: str = "s[001-002]") -> JobView:
    slurm = SlurmJob(key, "x", "alice", "RUNNING", "gpu", nodes=nodes)
    return JobView(key=key, ref=JobRef(key, "x", None, None, "slurm"), first_seen=T0, slurm=slurm)


class Said:
    def __init__(self) -> None:
        self.notices: list[Notice] = []

    def __call__(self, notice: Notice, now: float) -> None:
        self.notices.append(notice)


class Scontrol:
    """`scontrol -d show job` answers, counted."""

    def __init__(self, fail: bool = False) -> None:
        self.asked: list[str] = []
        self.fail = fail

    async def __call__(self, job_id: str) -> str | None:
        self.asked.append(job_id)
        await asyncio.sleep(0.01)
        if self.fail:
            raise SlurmCommandError(["scontrol"], "timeout", "no answer within 20 s")
        return DETAIL.format(job=job_id)


async def test_not_enabled_is_no_source() -> None:
    said = Said()
    assert await open_site(loads(""), tunnels=None, detail=None, announce=said, now=T0) is None
    assert said.notices == []


async def test_a_secret_that_cannot_be_read_runs_without_the_source_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    cfg = cfg_for(down_url(), auth="bearer", secret_credential="site-prometheus-token")
    said = Said()
    assert await open_site(cfg, tunnels=None, detail=None, announce=said, now=T0) is None
    (notice,) = said.notices
    assert notice.title == "site Prometheus not used"
    assert "settings cannot be used" in notice.body and "secret_credential" in notice.body
    assert "step budget" in notice.body


async def test_a_server_that_does_not_answer_is_kept_unchecked_one_notice_and_unknown_verdicts() -> None:
    said = Said()
    site = await open_site(cfg_for(down_url()), tunnels=None, detail=Scontrol(), announce=said, now=T0)
    assert site is not None and not site.checked and site.usable
    assert said.notices == []  # the degraded notice is the source's, said once by the tick loop
    (degraded,) = site.take_notices()
    assert degraded.title == "site Prometheus degraded" and "not answering" in degraded.body
    queries = site.source.queries
    verdicts = await asyncio.gather(*(site.early_verdict(view(str(j)), T0 + 1) for j in range(5)))
    assert all(v.state is GpuHangState.NO_DATA and "step budget" in v.summary for v in verdicts)
    assert site.source.queries == queries + 1  # one check again for five jobs, not five
    await site.early_verdict(view("9"), T0 + 2)
    assert site.source.queries == queries + 1  # and not again before RECHECK_S
    await site.early_verdict(view("9"), T0 + 2 + RECHECK_S)
    assert site.source.queries == queries + 2
    assert site.take_notices() == []  # still the same episode
    assert site.status()["checked"] is False
    await site.close()


async def test_the_placement_asks_scontrol_once_per_job_and_its_node_list() -> None:
    scontrol = Scontrol()
    site = SiteJobs(cfg_for(down_url()), _source(cfg_for(down_url())), detail=scontrol)
    v = view("8104")
    placements = await asyncio.gather(*(site.placement(v) for _ in range(3)))
    assert scontrol.asked == ["8104"]
    p = placements[0]
    assert p is not None and p.nodes == ("s001", "s002") and p.job_id == "8104"
    assert p.gpus["s002"].indices == frozenset({4, 5, 6, 7})
    assert await site.placement(v) is p and scontrol.asked == ["8104"]
    assert v.slurm is not None
    moved = view("8104", nodes="s003")  # Slurm moved it (a requeue): asked again
    assert (await site.placement(moved)) is not None and scontrol.asked == ["8104", "8104"]
    assert await site.placement(view("1", nodes="")) is None  # pending: no node
    site.retain({"1"})
    assert site.status()["placements"] == 0
    await site.close()


async def test_whole_nodes_need_no_scontrol_and_a_failed_one_is_not_retried() -> None:
    exclusive = cfg_for(down_url(), exclusive_nodes=True)
    scontrol = Scontrol()
    site = SiteJobs(exclusive, _source(exclusive), detail=scontrol)
    p = await site.placement(view("8101"))
    assert p is not None and p.exclusive and scontrol.asked == []
    failing = Scontrol(fail=True)
    shared = cfg_for(down_url())
    site2 = SiteJobs(shared, _source(shared), detail=failing)
    p2 = await site2.placement(view("8102"))
    assert p2 is not None and p2.gpus == {} and not p2.exclusive  # rule SITE-4 decides without indices
    await site2.placement(view("8102"))
    assert failing.asked == ["8102"]
    await site.close()
    await site2.close()


def tgs(job: str, *, resolved: bool = False) -> Finding:
    return Finding(
        "tgs", job, TGS, "warning", "TGS -20% over steps 20–44", {"change": "-20.0%"}, resolved=resolved
    )


def hold_for(site: SiteJobs) -> SlowHostHold:
    """The `slow host` stage's hold with this site source (as `TsdbEnricher.use_site` sets it)."""
    settings = TsdbSettings()
    hold = SlowHostHold(settings, SshTunnelPool(settings.ssh), tick_s=15.0)
    hold.site = site
    return hold


async def test_the_tgs_page_waits_one_tick_for_its_slow_host_and_then_goes_out() -> None:
    cfg = cfg_for(down_url())
    site = SiteJobs(cfg, _source(cfg), detail=Scontrol())
    hold = hold_for(site)
    book = IncidentBook.from_config(IncidentsConfig())
    views = {"8110": view("8110"), "8111": view("8111", nodes="")}
    out = hold.hold_tgs([tgs("8110"), tgs("8111")], views, T0, book)
    assert [f.job_id for f in out] == ["8111"]  # no node to compare: at once, without the fact
    assert "slow host" not in out[0].details
    assert hold.status()["held_tgs"] == 1
    await hold.settled()  # the comparison fails fast: nothing listens
    (f,) = hold.hold_tgs([tgs("8110")], views, T0 + 15, book)
    assert f.details["slow host"].startswith("no host compared: site Prometheus"), f.details
    assert "suspect host" not in f.details and f.details["change"] == "-20.0%"
    assert hold.status() == {"held_tgs": 0, "comparisons": 1}
    await hold.close()
    await site.close()


async def test_a_slow_comparison_holds_the_page_one_tick_only_and_reminders_pass() -> None:
    cfg = cfg_for(down_url())
    site = SiteJobs(cfg, _source(cfg), detail=_Never())
    hold = hold_for(site)
    book = IncidentBook.from_config(IncidentsConfig())
    views = {"8110": view("8110")}
    assert hold.hold_tgs([tgs("8110")], views, T0, book) == []
    assert hold.hold_tgs([tgs("8110")], views, T0 + 15, book) == []  # one more tick
    (f,) = hold.hold_tgs([tgs("8110")], views, T0 + 30, book)
    assert "the site Prometheus did not answer within a tick" in f.details["slow host"]
    book.observe_all([f], T0 + 30)
    (again,) = hold.hold_tgs([tgs("8110")], views, T0 + 45, book)  # open and announced: a reminder
    assert "slow host" not in again.details
    (gone,) = hold.hold_tgs([tgs("8110", resolved=True)], views, T0 + 60, book)
    assert gone.resolved
    await hold.close()
    await site.close()


def test_the_slow_host_fact_names_hosts_with_evidence_or_says_why_none() -> None:
    named = SlowHostVerdict(
        ("r003",), (), {"r003": ("RDMA retransmits 25/s vs the other hosts' median 0.05/s (higher)",)}, "…"
    )
    assert slow_host_text(named) == "r003 (RDMA retransmits 25/s vs the other hosts' median 0.05/s (higher))"
    none = SlowHostVerdict((), (), {}, "no host stands out among 5 on GPU power: the slide is the job's")
    assert slow_host_text(none) == none.summary


class _Never:
    """An scontrol that never answers (the placement, and so the comparison, waits)."""

    async def __call__(self, job_id: str) -> str | None:
        await asyncio.Event().wait()
        return None


def _source(cfg: Config):  # type: ignore[no-untyped-def]
    from jobdiagd.service.site_source import build_site_source

    src = build_site_source(cfg)
    assert src is not None
    return src


def test_the_notices_words_name_the_server_and_the_step_budget() -> None:
    from jobdiagd.alerts import notices

    d = notices.site_prometheus_degraded("http://prom:9090", "timed out after 5s", T0)
    r = notices.site_prometheus_recovered("http://prom:9090", T0, T0 + 125)
    u = notices.site_prometheus_unusable("http://prom:9090", ["[site_prometheus] power: no series"], T0)
    assert "check of its metric map failed" in u.body and "[site_prometheus.metrics]" in u.body
    assert (
        d.key == f"site-prometheus-degraded:{int(T0)}" and "step budget" in d.body and d.severity == "warning"
    )
    assert r.key == f"site-prometheus-recovered:{int(T0)}" and "not answering for 2 min" in r.body
    assert "- [site_prometheus] power: no series" in u.body


async def test_a_site_that_compares_nothing_hands_the_slide_to_the_job_s_own_prometheus() -> None:
    """Rule SLOW-6's order: the site first; the job's own when the site compared nothing. Both
    failing is one "no host compared" naming each source and why (no network for the own one:
    its head node is refused before any forward)."""
    cfg = cfg_for(down_url())
    site = SiteJobs(cfg, _source(cfg), detail=Scontrol())
    hold = hold_for(site)
    own = DiagnosisContext(job_dir=None, nodes=("s001", "s002"), status="running", head_node="$(x)", port=9)
    result = await hold._compare(view("8110"), T0, site, own)
    assert result.slide is None and result.verdict.hosts == ()
    why = result.verdict.summary
    assert why.startswith("no host compared: site Prometheus: "), why
    assert why.endswith("; the job's own Prometheus: invalid host name from log: '$(x)'"), why
    assert fact_text(result) == why  # no source answered: nothing to credit
    await hold.close()
    await site.close()


def test_the_fact_says_which_source_answered() -> None:
    named = SlowHostVerdict(("r003",), (), {"r003": ("RDMA retransmits 25/s",)}, "…", ("rdma_retrans",))
    answered = SlideAnswer(True, T0, T0 + 60)
    assert fact_text(SlowHostResult(named, answered, "the job's own Prometheus")) == (
        "r003 (RDMA retransmits 25/s) (compared on the job's own Prometheus)"
    )
    failed = SlowHostVerdict((), (), {}, "no host compared: site Prometheus: refused")
    assert (
        fact_text(SlowHostResult(failed, SlideAnswer(False, T0, T0 + 60, error="refused"))) == failed.summary
    )
