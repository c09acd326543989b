#!/usr/bin/env bash
# The main job on a bundled default: set up, build the bundled sample outputs/ (simulated
# MaxText jobs written in the real log formats), triage every job in it, and print the
# full runbook report of the most instructive one (a hang that ended in a heartbeat kill).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
OUT=${JOBDIAGD_DEMO_OUTPUTS:-.demo/outputs}
if [ ! -f "$OUT/manifest.json" ]; then
  mkdir -p "$OUT"
  .venv/bin/python -m jobdiagd_sim.scenarios "$OUT" \
    --only completed-ray0 --only completed-ray1-truncated --only hanging --only heartbeat-after-stall \
    --only oom-cascade --only tgs-constant-drop --only soft-success-b --only cancelled-after-hang >/dev/null
fi
# Each sample carries the clock and Slurm state it was "observed" at, so results are reproducible.
.venv/bin/python - "$OUT/manifest.json" <<'PY'
import json, subprocess, sys
from pathlib import Path
root = Path(sys.argv[1]).parent
doc = json.load(open(sys.argv[1]))
jobs = doc["jobs"] if isinstance(doc, dict) else doc
for e in jobs:
    e["job_dir"] = str(root / e["job_dir"])
print(f"{'scenario':<26} {'status':<10} {'primary':<18} what happened")
for e in jobs:
    cmd = [".venv/bin/jobdiagd", "triage", e["job_dir"], "--json", "--now", str(e["now"])]
    cmd += ["--slurm-state", e["slurm_state"]] if e.get("slurm_state") else ["--no-slurm"]
    d = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    tgs = f" TGS {d['tgs']['change_pct']:+.0f}% ({d['tgs']['pattern']})" if d["tgs"]["degraded"] else ""
    print(f"{e['scenario']:<26} {d['status']:<10} {str(d['primary_failure']):<18} last step {d['progress']['last_step']}/{d['progress']['total_steps']}{tgs}")
hb = next(e for e in jobs if e["scenario"] == "heartbeat-after-stall")
print(f"\n== jobdiagd triage {hb['job_dir']}\n", flush=True)
subprocess.run([".venv/bin/jobdiagd", "triage", hb["job_dir"], "--now", str(hb["now"]), "--no-slurm"], check=True)
PY
