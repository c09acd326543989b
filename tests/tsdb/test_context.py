"""The diagnosis context built in-process from a TriageResult equals the one parsed from its document.

The daemon builds it with `context_from_result` (no dict round trip); the CLI reads a
`--triage-json` file with `context_from_triage`. Both are checked on every job of the simulator's
scenario corpus, also after a JSON round trip of the document (what a file on disk holds).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from jobdiagd.triage.engine import triage
from jobdiagd.tsdb.context import DiagnosisContext, context_from_result, context_from_triage


def test_context_from_result_equals_context_from_its_document(
    corpus: tuple[Path, dict[str, dict[str, object]]],
) -> None:
    root, exps = corpus
    contexts: list[DiagnosisContext] = []
    differ: list[str] = []
    for name, e in sorted(exps.items()):
        if not e["is_job"]:
            continue  # e.g. a shared checkpoint directory: triage refuses it
        res = triage(
            str(e["job_dir"] or e["log"]),
            now=float(e["now"]),  # type: ignore[arg-type]
            slurm_state=e.get("slurm_state"),  # type: ignore[arg-type]
            outputs_root=root,
        )
        typed = context_from_result(res)
        if typed != context_from_triage(res.to_dict()) or typed != context_from_triage(
            json.loads(json.dumps(res.to_dict()))
        ):
            differ.append(name)
        contexts.append(typed)
    assert differ == []
    # The comparison is only as good as the fields it sees set: each is set in some scenario
    # (none runs with a live Prometheus tunnel).
    unset = {
        f.name
        for f in dataclasses.fields(DiagnosisContext)
        if all(getattr(c, f.name) in (None, (), {}) for c in contexts)
    }
    assert unset <= {"tunnel"}, unset
    assert len(contexts) >= 40
