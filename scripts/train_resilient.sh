#!/usr/bin/env bash
# Runs a training job again after a failure (a rank or a host dying, a node rebooting), up to N
# restarts, each resuming from the newest checkpoint: the command must pass --resume auto to
# train_gpt2. Every restart is logged with the exit code and the job's first actual error line.
#   scripts/train_resilient.sh [--max-restarts 3] [--log FILE] -- scripts/mpirun.sh ... build/train_gpt2 ... --resume auto
# With scripts/mpirun.sh as the launcher, Ctrl-C saves a checkpoint and ends the job and this loop
# (exit 0); with plain mpirun, Ctrl-C loses the work since the last checkpoint (see README).
# Exit: 0 when a run finished; otherwise the last run's exit code.
set -uo pipefail
max_restarts=3
log=""
while (($#)); do
  case "$1" in
    --max-restarts) max_restarts=${2:-}; shift $(($# > 1 ? 2 : 1)) ;;
    --log) log=${2:-}; shift $(($# > 1 ? 2 : 1)) ;;
    --) shift; break ;;
    *) echo "usage: $0 [--max-restarts N] [--log FILE] -- COMMAND..." >&2; exit 2 ;;
  esac
done
(($#)) || { echo "usage: $0 [--max-restarts N] [--log FILE] -- COMMAND..." >&2; exit 2; }
[[ $max_restarts =~ ^[0-9]+$ ]] || { echo "train_resilient: --max-restarts must be a number" >&2; exit 2; }
if [[ " $* " != *" --resume auto "* ]]; then
  echo "train_resilient: the command must pass --resume auto, or a restart would start over" >&2
  exit 2
fi
say() { echo "[train_resilient] $*" >&2; [[ -z $log ]] || echo "$(date -u +%FT%TZ) $*" >>"$log"; }
# The job's first error line in FILE: our programs' "error: ..." or "error (rank R of N): ..."
# (also behind mpirun --tag-output's "[job,rank]<stderr>:"); failing that, Open MPI's own failure
# lines (a rank killed, a daemon lost, MPI_ABORT, a launch that failed), never its "Primary job
# terminated normally, but ... Per user-direction, the job has been aborted." preamble.
first_error() {
  local ours
  ours=$(grep -m1 -E '^(\[[0-9,]+\]<std(out|err)>: ?)?error( \(rank [0-9]+ of [0-9]+\))?: ' "$1")
  if [[ -n $ours ]]; then
    echo "$ours"
    return
  fi
  grep -viE 'terminated normally|per user-direction' "$1" |
    grep -m1 -iE 'exited on signal|lost communication|unexpectedly failed|MPI_ABORT was invoked|was unable to|not enough slots|received signal|terminate called|exited with non-zero status|killed|aborted|error'
}

output=$(mktemp)
trap 'rm -f "$output"' EXIT
# Ctrl-C or SIGTERM stops the job and this loop; it is not a failure to restart from.
stopping=0
trap 'stopping=1' INT TERM
for ((attempt = 0; ; attempt++)); do
  # tee ignores the terminal's signals: it must pass on what the job prints while it stops.
  "$@" 2>&1 | (trap '' INT TERM HUP; exec tee "$output")
  code=${PIPESTATUS[0]}
  if ((code == 0)); then
    ((attempt == 0)) || say "finished after $attempt restart(s)"
    exit 0
  fi
  if ((stopping)) || ((code == 130 || code == 143)); then
    say "stopped by a signal (exit code $code): not restarting"
    exit "$code"
  fi
  reason=$(first_error "$output")
  if ((attempt >= max_restarts)); then
    say "giving up after $attempt restart(s): exit code $code${reason:+: $reason}"
    exit "$code"
  fi
  say "restart $((attempt + 1))/$max_restarts after exit code $code${reason:+: $reason}"
  sleep 1
done
