"""`jobdiagd triage` without `--workers`: as many forked readers as idle CPUs, at most two."""

from __future__ import annotations

import pytest

from jobdiagd.triage import cli


@pytest.mark.parametrize(
    ("cpus", "others", "want"),
    [
        (2, 0, 2),  # an idle 2-CPU machine: two workers
        (2, 1, 1),  # one CPU busy: a second worker would only queue
        (2, 6, 1),  # a busy login node: read in this process
        (1, 0, 1),
        (8, 0, 2),  # never more than MAX_AUTO_WORKERS
        (8, 5, 2),
        (4, 3, 1),
        (2, None, 2),  # load unknown: the CPUs bound it
        (1, None, 1),
    ],
)
def test_auto_workers(cpus: int, others: int | None, want: int) -> None:
    assert cli.auto_workers(cpus, others) == want


def test_others_running_reads_this_machine() -> None:
    got = cli._others_running()
    assert got is None or got >= 0


def test_explicit_workers_are_kept(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--workers N` is the user's choice whatever the load; without it the load decides."""
    from jobdiagd import cli as top
    from jobdiagd.logs import reader

    chosen: list[int] = []
    monkeypatch.setattr(reader, "set_default_workers", chosen.append)
    monkeypatch.setattr(cli, "_others_running", lambda: 7)
    for argv in (["triage", "--workers", "2", "--no-slurm"], ["triage", "--no-slurm"]):
        assert top.main(argv) == 2  # nothing to triage: the workers are chosen before that
    assert chosen == [2, 1]
    assert top.main(["triage", "--workers", "0"]) == 2
    assert "--workers must be at least 1" in capsys.readouterr().err
