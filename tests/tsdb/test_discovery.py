"""Discovery: families, hosts vs NNODES, whole-TSDB time range (not the head block), GPU model, job-end hook."""

from __future__ import annotations

import time
from pathlib import Path

from jobdiagd.tsdb.access import LocalPrometheus, TsdbHandle
from jobdiagd.tsdb.client import PromClient
from jobdiagd.tsdb.discovery import discover
from jobdiagd.tsdb.job_end import job_end_diagnosis
from jobdiagd.tsdb.settings import TsdbSettings
from tests.helpers.tsdb import Fixtures, make_ctx, triage_doc


async def test_discovery(fixtures: Fixtures, tmp_path: Path) -> None:
    b = fixtures.copy("dead-node", tmp_path)
    s = TsdbSettings(work_dir=str(tmp_path))
    ctx = make_ctx(b, nodes=(*b.sim.sc.nodes, "node005"), nnodes=5)
    async with LocalPrometheus(b.files.prometheus, s) as prom, PromClient(prom.base_url) as c:
        d = await discover(TsdbHandle(c, "local-readonly", "t", b.files.prometheus), ctx, s)
        head = (await c.status_tsdb())["headStats"]
        # Only the block metadata gives the whole range; the head of an old TSDB is a single point.
        assert head["minTime"] == head["maxTime"]
        assert d.min_time == b.sim.sc.start and 0 <= b.sim.end - d.max_time < b.sim.sc.ray_interval + 0.01
        assert "block meta.json" in d.range_source
        assert d.families["hw_gpu_"] == 19 and d.families["tb_"] == 9 and d.families["ray_node_"] == 4
        assert d.hosts == b.sim.sc.nodes and d.missing_hosts == ("node005",)
        assert any("NNODES=5" in n for n in d.notes)
        assert d.gpus_per_host == 8 and d.gpu_model == "MI300X"  # from 192 GiB VRAM
        # `up` at the end: node003 stopped being scraped.
        ups = {inst: v for job, inst, v, _ in d.targets if job == "node_hw"}
        assert ups["node001:9400"] == 1.0 and ups.get("node003:9400", 0.0) == 0.0
        assert d.timeline.fills_dropped > 0 and d.timeline.last_step == b.sim.steps[-1].step
        assert c.query_count <= 8


async def test_job_end_hook(fixtures: Fixtures, tmp_path: Path) -> None:
    b = fixtures.copy("host-oom-ramp", tmp_path)
    doc = await job_end_diagnosis(triage_doc(b), time.time(), settings=TsdbSettings(work_dir=str(tmp_path)))
    assert doc is not None and doc["playbook"] == "oom" and doc["verdict"] == "host-oom-ramp"
    assert await job_end_diagnosis(triage_doc(b, primary_failure=None), time.time()) is None
