"""Access modes: host validation, block copy, one Prometheus per directory, stale locks, live fallback, ssh backoff."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from jobdiagd.tsdb.access import (
    AccessError,
    LocalPrometheus,
    NoTsdb,
    SshTunnelPool,
    copy_tsdb,
    open_tsdb,
    read_blocks,
    tsdb_has_data,
    validate_host,
)
from jobdiagd.tsdb.settings import SshSettings, TsdbSettings
from tests.helpers.tsdb import Fixtures, make_ctx

NODES = ("node001", "node002")


@pytest.mark.parametrize(
    "bad", ["node003", "node001;rm -rf /", "-oProxyCommand=x", "node001 node002", "", "a" * 300, "../node001"]
)
def test_validate_host_rejects(bad: str) -> None:
    with pytest.raises(AccessError):
        validate_host(bad, NODES)


def test_validate_host_accepts_listed_and_fqdn() -> None:
    assert validate_host("node002", NODES) == "node002"
    # The node list's spelling reaches ssh, whichever form the log wrote.
    assert validate_host("node001.cluster.local", NODES) == "node001"
    assert validate_host("node001", ("node001.cluster.local",)) == "node001.cluster.local"


@pytest.mark.parametrize("name", ["node001.evil.example", "node001.cluster.evil"])
def test_a_log_cannot_send_ssh_to_another_domain(name: str) -> None:
    # node001 is listed; a log naming it under a domain the list does not have must not route
    # the ssh tunnel there: the listed name is used, never the log's.
    assert validate_host(name, NODES) == "node001"
    with pytest.raises(AccessError):
        validate_host(name, ("node001.cluster.local", "node002.cluster.local"))


def test_copy_excludes_live_files(tmp_path: Path) -> None:
    src = tmp_path / "prom"
    (src / "01ARZ3NDEKTSV4RRFFQ69G5FAV" / "chunks").mkdir(parents=True)
    (src / "01ARZ3NDEKTSV4RRFFQ69G5FAV" / "meta.json").write_text(
        '{"minTime": 1000, "maxTime": 7201000, "stats": {"numSamples": 5}}'
    )
    (src / "wal").mkdir()
    (src / "wal" / "00000001").write_bytes(b"x" * 10)
    (src / "chunks_head").mkdir()
    (src / "lock").write_text("")
    dst = tmp_path / "copy"
    copy_tsdb(src, dst)
    assert sorted(p.name for p in dst.iterdir()) == ["01ARZ3NDEKTSV4RRFFQ69G5FAV"]
    assert (src / "lock").exists()  # the source lock is never touched
    assert read_blocks(dst)[0].max_time == 7201.0
    assert tsdb_has_data(src) and not tsdb_has_data(tmp_path / "nope")


async def test_never_two_on_one_directory_and_stale_lock(fixtures: Fixtures, tmp_path: Path) -> None:
    b = fixtures.copy("rccl-hang", tmp_path)  # this fixture carries a stale `lock` file left by the job
    assert (b.files.prometheus / "lock").exists()
    s = TsdbSettings(work_dir=str(tmp_path))
    async with LocalPrometheus(b.files.prometheus, s) as first:
        assert first.proc is not None and first.proc.returncode is None
        with pytest.raises(AccessError, match="already has"):
            async with LocalPrometheus(b.files.prometheus, s):
                pass
    # Released on exit: a new instance may open it again.
    async with LocalPrometheus(b.files.prometheus, s) as again:
        assert again.proc is not None


async def test_missing_binary_is_a_clear_error(fixtures: Fixtures, tmp_path: Path) -> None:
    b = fixtures.copy("healthy", tmp_path)
    with pytest.raises(AccessError, match="prometheus binary not found: /nonexistent/prometheus"):
        async with LocalPrometheus(
            b.files.prometheus, TsdbSettings(prometheus_binary="/nonexistent/prometheus")
        ):
            pass


async def test_no_tsdb_cases(fixtures: Fixtures, tmp_path: Path) -> None:
    b = fixtures.copy("healthy", tmp_path)
    s = TsdbSettings(work_dir=str(tmp_path))
    with pytest.raises(NoTsdb, match="RAY=0"):
        async with open_tsdb(make_ctx(b, ray=False), s, now=time.time()):
            pass
    empty = tmp_path / "empty-job"
    (empty / "prometheus").mkdir(parents=True)
    with pytest.raises(NoTsdb, match="no TSDB data"):
        async with open_tsdb(make_ctx(b, job_dir=empty), s, now=time.time()):
            pass


async def test_live_unreachable_falls_back_to_block_copy(fixtures: Fixtures, tmp_path: Path) -> None:
    b = fixtures.copy("healthy", tmp_path)
    (b.files.prometheus / "wal").mkdir(exist_ok=True)
    (b.files.prometheus / "wal" / "00000000").write_bytes(b"live")
    before = sorted(p.name for p in b.files.prometheus.iterdir())
    pool = SshTunnelPool(SshSettings(port=1, max_attempts=1, connect_timeout_s=2), sleep=_no_sleep)
    ctx = make_ctx(b, status="running")
    async with open_tsdb(ctx, TsdbSettings(work_dir=str(tmp_path)), now=time.time(), tunnels=pool) as h:
        assert h.mode == "copy-readonly"
        assert any("last <= 2 h" in n for n in h.notes) and any("unreachable" in n for n in h.notes)
        assert h.tsdb_dir is not None and h.tsdb_dir != b.files.prometheus
        # Prometheus starts its own empty WAL in the copy; the job's segment was not copied.
        seg = h.tsdb_dir / "wal" / "00000000"
        assert not seg.exists() or seg.read_bytes() != b"live"
        assert await h.client.label_values("host")
    await pool.close()
    # The live directory was never opened by a Prometheus: nothing was added to it.
    assert sorted(p.name for p in b.files.prometheus.iterdir()) == before
    with pytest.raises(AccessError, match="unreachable"):
        async with open_tsdb(
            ctx, TsdbSettings(work_dir=str(tmp_path)), now=time.time(), tunnels=pool, allow_copy=False
        ):
            pass


async def test_live_host_must_be_in_node_list(fixtures: Fixtures, tmp_path: Path) -> None:
    b = fixtures.copy("healthy", tmp_path)
    ctx = make_ctx(b, status="running", head_node="evil.example.com")
    with pytest.raises(AccessError, match="not in the job's node list"):
        async with open_tsdb(ctx, TsdbSettings(), now=time.time()):
            pass


async def test_fresh_wal_means_copy_even_if_finished(fixtures: Fixtures, tmp_path: Path) -> None:
    b = fixtures.copy("healthy", tmp_path)
    (b.files.prometheus / "wal").mkdir(exist_ok=True)
    seg = b.files.prometheus / "wal" / "00000000"
    seg.write_bytes(b"x")
    now = time.time()
    os.utime(seg, (now, now))
    async with open_tsdb(make_ctx(b, status="completed"), TsdbSettings(work_dir=str(tmp_path)), now=now) as h:
        assert h.mode == "copy-readonly"


async def _no_sleep(_s: float) -> None:
    return None


async def test_reconnect_backoff() -> None:
    delays: list[float] = []

    async def sleep(s: float) -> None:
        delays.append(s)

    pool = SshTunnelPool(
        SshSettings(port=1, max_attempts=4, backoff_initial_s=0.5, backoff_max_s=1.5, connect_timeout_s=2),
        sleep=sleep,
    )
    with pytest.raises(AccessError, match="ssh to 127.0.0.1 failed after 4 attempts"):
        await pool.forward("127.0.0.1", 9190)
    assert delays == [0.5, 1.0, 1.5]
    assert pool.connects == 4


async def test_second_open_of_same_job_reads_a_copy(fixtures: Fixtures, tmp_path: Path) -> None:
    b = fixtures.copy("healthy", tmp_path)
    s = TsdbSettings(work_dir=str(tmp_path))
    ctx = make_ctx(b)
    async with open_tsdb(ctx, s, now=time.time() + 600) as first:
        assert first.mode == "local-readonly"
        async with open_tsdb(ctx, s, now=time.time() + 600) as second:
            assert second.mode == "copy-readonly" and "could not open" in second.notes[0]
            assert await second.client.label_values("host") == list(b.sim.sc.nodes)
