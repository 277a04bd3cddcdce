# Sourced by the job scripts (evaluate.sbatch, sweep.sbatch): say what the allocation gave, and
# requeue the job when Slurm signals that its time limit is near.
#
# The scripts ask for `--signal=B:USR1@120`: 120 s before --time, Slurm sends SIGUSR1 to this
# batch shell (B: not to the job steps, so the running evaluate.py is not hit by it). The trap
# requeues the job (an array task by its own id); Slurm then ends the running step and starts the
# job again later, same arguments, output appended, and the evaluation resumes from the
# predictions.jsonl it was writing. `#SBATCH --requeue` lets preemption requeue it as well.
cbr2_job="${SLURM_JOB_ID:-}"
if [ -n "${SLURM_ARRAY_JOB_ID:-}" ]; then cbr2_job="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"; fi
echo "cbr2: job ${cbr2_job:-none} (restart ${SLURM_RESTART_COUNT:-0}) on $(hostname -s): partition ${SLURM_JOB_PARTITION:-?}," \
     "${SLURM_CPUS_PER_TASK:-?} CPUs, CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}, python ${CBR2_PYTHON:-.venv-gpu/bin/python}"

cbr2_requeue() {
  echo "cbr2: SIGUSR1, the time limit is near: requeueing job $cbr2_job; it resumes from what it wrote"
  scontrol requeue "$cbr2_job"
}
trap cbr2_requeue USR1

# cbr2_run CMD...: run CMD in the background and wait for it, so that bash runs the trap while it
# runs (a trap waits for the foreground command to end); returns CMD's exit status.
cbr2_run() {
  "$@" &
  local pid=$! rc=0
  while :; do
    wait "$pid" && rc=0 || rc=$?
    kill -0 "$pid" 2>/dev/null || return "$rc"  # still running: the wait was cut short by the signal
  done
}
