"""Appends a live, very long MaxText job's log step by step (memory benchmarks and long-run tests).

Every task prints its own copy of each `completed step:` line (`srun -l` + absl prefixes,
as the daemon reads them), with NCCL chatter between steps and a checkpoint save line every
`checkpoint_period` steps. Step time, throughput and time spent outside a step (a save
that `seconds:` does not count) can be shaped per step, so a test can put a slow save in
the middle of a million steps or a throughput slide at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from jobdiagd_sim import lines as L
from jobdiagd_sim.job import SIM_EPOCH

StepShape = Callable[[int], float]


class LongRun:
    """One job's log file, appended to on demand; `t` is the log clock (epoch seconds)."""

    def __init__(
        self,
        path: Path,
        *,
        job_id: str = "900001",
        tasks: int = 4,
        checkpoint_period: int = 1000,
        step_s: float = 2.0,
        tokens: float = 3000.0,
        total_steps: int = 10_000_000,
        start: float = SIM_EPOCH,
        period_in_log: bool = True,
    ) -> None:
        """`period_in_log=False`: neither the arguments nor the config print the checkpoint
        period; only the save lines show it (a period from the model's config file)."""
        self.path = path
        self.job_id = job_id
        self.tasks = tasks
        self.period = checkpoint_period
        self.step_s = step_s
        self.tokens = tokens
        self.step = 0
        self.t = start
        self.name = L.job_name("llama3.1-8b", "long")
        head = L.header_lines(
            job_id=job_id,
            name=self.name,
            nnodes=tasks,
            nodelist=f"node[001-{tasks:03d}]",
            jax_port=12321,
            ray_port=None,
            passthrough={
                "steps": total_steps,
                "enable_checkpointing": True,
                "checkpoint_period": checkpoint_period,
            }
            if period_in_log
            else {"steps": total_steps},
            model="llama3.1-8b",
        )
        if period_in_log:
            head += [f"{r}: {L.config_param('checkpoint_period', checkpoint_period)}" for r in range(tasks)]
        head += [f"{r}: {L.BARRIER_PASSED}" for r in range(tasks)]
        self._write(head)

    def _write(self, lines: list[str]) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")

    def _prefix(self, task: int, where: str = "metric_logger.py:232") -> str:
        return f"{task}: " + L.absl_prefix(self.t, 1234 + task, where)

    def steps(
        self,
        n: int,
        *,
        seconds: StepShape | None = None,
        tokens: StepShape | None = None,
        outside: StepShape | None = None,
    ) -> None:
        """Append `n` steps. Defaults: `step_s` (6x on a save step and the one after it),
        `tokens` with a little deterministic jitter, no time outside the step."""
        out: list[str] = []
        for _ in range(n):
            k = self.step
            save = k > 0 and k % self.period == 0
            if seconds is not None:
                secs = seconds(k)
            else:
                slow = k > 0 and k % self.period in (0, 1)
                secs = self.step_s * (6.0 if slow else 1.0) + (k % 7) * 0.001
            tgs = tokens(k) if tokens is not None else self.tokens + (k % 13)
            self.t += secs + (outside(k) if outside is not None else 0.0)
            f = L.StepFields(step=k, seconds=secs, tflops=140.0, tokens=tgs, total_weights=196608, loss=2.5)
            body = L.step_line(f)
            out.extend(self._prefix(task) + body for task in range(self.tasks))
            out.append(
                f"{k % self.tasks}: node00{k % self.tasks + 1}:1234:5678 [0] NCCL INFO Channel 00/0 : "
                "0[0] -> 1[1] via P2P/IPC/read"
            )
            if save:
                out.append(self._prefix(0, "checkpointing.py:90") + L.checkpoint_saved(k))
            self.step += 1
        self._write(out)

    def line(self, text: str, task: int = 0) -> None:
        """Any other line, as task `task` prints it now."""
        self._write([self._prefix(task, "train.py:1") + text])
