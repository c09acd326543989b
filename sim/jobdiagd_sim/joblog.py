"""JobLog: writes one job's outputs layout and its log line by line, in MaxText's real formats."""

from __future__ import annotations

from pathlib import Path

from jobdiagd_sim import lines as L


class JobLog:
    """Writes one job's outputs layout (`<id>-<name>.log` + dir with `log` link), in real formats."""

    def __init__(
        self,
        outputs: Path,
        job_id: str = "7001",
        name: str = "JAX-llama3.1-8b-test",
        *,
        steps: int = 1000,
        nnodes: int = 2,
        checkpoint_period: int | None = None,
        ray_port: int | None = None,
    ) -> None:
        self.outputs = outputs
        self.job_id = job_id
        self.name = name
        self.nnodes = nnodes
        self.dir = outputs / f"{job_id}-{name}"
        self.path = outputs / f"{job_id}-{name}.log"
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "log").symlink_to(f"../{self.path.name}")
        passthrough: dict[str, object] = {"steps": steps}
        if checkpoint_period:
            passthrough.update(enable_checkpointing=True, checkpoint_period=checkpoint_period)
        self.write(
            *L.header_lines(
                job_id=job_id,
                name=name,
                nnodes=nnodes,
                nodelist=L.compact_nodelist(L.hostnames(nnodes)),
                jax_port=12321,
                ray_port=ray_port,
                passthrough=passthrough,
                model="llama3.1-8b",
            )
        )

    def write(self, *lines: str) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            for ln in lines:
                fh.write(ln + "\n")

    def task(self, rank: int, text: str) -> None:
        self.write(L.srun_prefix(rank, self.nnodes) + text)

    def step(self, n: int, seconds: float = 2.0, tokens: float = 3000.0) -> None:
        f = L.StepFields(
            step=n, seconds=seconds, tflops=tokens * 0.0156, tokens=tokens, total_weights=196608, loss=2.5
        )
        for r in range(self.nnodes):
            self.task(r, L.step_line(f))

    def summary(self, rc: int, failure: str | None = None) -> None:
        self.write(
            *L.job_summary(
                job_id=self.job_id,
                name=self.name,
                model="llama3.1-8b",
                nnodes=self.nnodes,
                wall=600,
                rc=rc,
                failure=failure,
            )
        )
