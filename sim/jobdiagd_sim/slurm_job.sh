#!/bin/bash
# Simulated MaxText job for a real Slurm cluster (integration tests and demos).
#
#   sbatch --job-name=JAX-llama3.1-8b-live --output=<outputs>/%j-%x.log \
#          [--nodes=1 --ntasks=2 --overcommit] sim/jobdiagd_sim/slurm_job.sh <outputs> [live args...]
#
# Prints the header like _job.sbatch, creates <outputs>/<id>-<name>/ with its `log` link, runs
# `srun -l` over the tasks (each task is `python -m jobdiagd_sim.live --rank`, so srun adds the real
# task prefixes), reports non-zero task exits as NODE_EXIT, and prints the JOB SUMMARY from an
# EXIT trap; scancel (SIGTERM) gives `FAILED (exit 143) — CANCELLED (scancel / SIGTERM)`.
# Live args are passed through, e.g. --steps 50 --step-time 2 --hang-after 20.
# SIM_PYTHON selects the interpreter (it must be able to import jobdiagd and jobdiagd_sim: the
# dev virtualenv's, .venv/bin/python); default python3.
#SBATCH --overcommit

OUTPUTS="${1:?usage: slurm_job.sh <outputs-dir> [live args...]}"
shift
PY="${SIM_PYTHON:-python3}"
_JOB_START=$SECONDS

JOB_ID="${SLURM_JOB_ID:?not running under Slurm}"
JOB_NAME="${SLURM_JOB_NAME:-JAX-sim}"
NNODES="${SLURM_JOB_NUM_NODES:-1}"
NTASKS="${SLURM_NTASKS:-$NNODES}"
MODEL_NAME="${SIM_MODEL:-llama3.1-8b}"
JAX_PORT=12321

steps=20
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    [[ "${args[i]}" == "--steps" ]] && steps="${args[i+1]}"
done

echo "JOB_ID=$JOB_ID"
echo "JOB_NAME=$JOB_NAME"
echo "NNODES=$NNODES"
echo "JOB_NODELIST=$SLURM_JOB_NODELIST"
echo "JAX_COORDINATOR_PORT=$JAX_PORT"
echo "PASSTHROUGH_ARGS=\"steps=$steps\""
echo "MODEL_NAME=$MODEL_NAME"
echo "[INFO] Running from artifact: $(pwd)"
echo "=== GIT SUMMARY BEGIN ==="
echo "repo:    jobdiagd-sim"
echo "dirty:   clean"
echo "=== GIT SUMMARY END ==="
echo '==STAGE TIMEOUTS (override: STAGE_TIMEOUTS="stage:seconds,...")=='
echo "  preflight    900s"
echo "  pull         900s"
echo "  ecc          300s"
echo "  train        none"

JOB_DIR="$OUTPUTS/$JOB_ID-$JOB_NAME"
mkdir -p "$JOB_DIR"
[ -L "$JOB_DIR/log" ] || ln -s "../$JOB_ID-$JOB_NAME.log" "$JOB_DIR/log"

_fmt_elapsed() {
    local s=$1
    if (( s >= 3600 )); then printf '%dh %dm %ds' $((s/3600)) $((s%3600/60)) $((s%60))
    elif (( s >= 60 )); then printf '%dm %ds' $((s/60)) $((s%60))
    else printf '%ds' "$s"
    fi
}
_print_summary() {
    local rc=${_CANCEL_RC:-$?}
    echo "========================== JOB SUMMARY =========================="
    echo "  Job:    ${JOB_ID:-?} (${JOB_NAME:-?})"
    echo "  Model:  ${MODEL_NAME:-?}"
    echo "  Nodes:  ${NNODES:-?}"
    echo "  Wall:   $(_fmt_elapsed $(( SECONDS - _JOB_START )))"
    if [[ $rc -eq 0 ]]; then
        echo "  Status: SUCCESS (exit 0)"
    else
        echo "  Status: FAILED (exit $rc) — ${_STAGE_FAILURE:-unknown}"
    fi
    echo "================================================================="
}
trap _print_summary EXIT
_handle_cancel() {
    _STAGE_FAILURE="CANCELLED (scancel / SIGTERM)"
    _CANCEL_RC=143
    [ -n "${_SRUN_PID:-}" ] && kill -TERM "$_SRUN_PID" 2>/dev/null && wait "$_SRUN_PID" 2>/dev/null
    exit 143
}
trap _handle_cancel TERM

# Same shape as _job.sbatch's NODE_REPORT wrapper: each task reports its own non-zero exit.
NODE_REPORT='"$@" & _cpid=$!; trap "kill $_cpid 2>/dev/null" TERM INT; wait $_cpid 2>/dev/null; wait $_cpid 2>/dev/null; _rc=$?; [ $_rc -ne 0 ] && echo "NODE_EXIT host=${SLURMD_NODENAME:-$(hostname)} exit=$_rc"; exit $_rc'

for stage in Preflight "Docker pull" "ECC check"; do
    case "$stage" in Preflight) t=900;; "Docker pull") t=900;; *) t=300;; esac
    echo "== $stage BEGIN (timeout=${t}s) =="
    echo "== $stage END (0s) =="
done

_T0=$SECONDS
echo "== Training BEGIN (timeout=none) =="
# Background + wait so the TERM trap runs while srun is still alive.
srun -l --kill-on-bad-exit=1 --overcommit -n "$NTASKS" bash -c "$NODE_REPORT" _ \
    "$PY" -u -m jobdiagd_sim.live --rank --nnodes "$NTASKS" --model "$MODEL_NAME" "$@" &
_SRUN_PID=$!
wait "$_SRUN_PID"
rc=$?
if [ $rc -ne 0 ]; then
    echo "== Training FAILED (exit=$rc, $((SECONDS - _T0))s) =="
    _STAGE_FAILURE="Training FAILED (exit=$rc)"
    exit 1
fi
echo "== Training END ($((SECONDS - _T0))s) =="
exit 0
