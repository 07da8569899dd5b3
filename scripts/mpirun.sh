#!/usr/bin/env bash
# mpirun with a stop that keeps the work: Ctrl-C, SIGTERM or SIGHUP become SIGUSR1 to mpirun, which
# Open MPI forwards to every rank, so train_gpt2 stops at the next step boundary, writes a
# checkpoint and the job exits 0. A second Ctrl-C ends the job at once (mpirun's own stop).
#   scripts/mpirun.sh -np 2 build/train_gpt2 --threads 1      (any mpirun arguments)
# Why: mpirun answers SIGINT/SIGTERM itself by sending the ranks SIGCONT, SIGTERM one second later
# and SIGKILL one second after that (Open MPI 4.1, measured), too soon for a step and a checkpoint
# of a large model; and a terminal's Ctrl-C reaches mpirun, not the ranks, which Open MPI puts in
# process groups of their own. Here mpirun runs in a process group of its own, so the terminal's
# Ctrl-C reaches only this script. MPIRUN names another launcher (default: mpirun).
# As root (a container, typically), Open MPI refuses to start unless told root is allowed: this
# script tells it (--allow-run-as-root), and says so, unless OMPI_ALLOW_RUN_AS_ROOT is set.
# Exit: mpirun's exit code.
set -uo pipefail
if (($# == 0)); then
  echo "usage: $0 MPIRUN-ARGUMENTS... (e.g. -np 2 build/train_gpt2 --threads 1)" >&2
  exit 2
fi
launcher=${MPIRUN:-mpirun}
root_args=()
if [[ $(id -u) -eq 0 && -z "${OMPI_ALLOW_RUN_AS_ROOT:-}" && " $* " != *" --allow-run-as-root "* ]]; then
  case "$(basename "$launcher")" in
    mpirun | mpiexec | orterun)
      root_args=(--allow-run-as-root)
      echo "[mpirun.sh] running as root: passing --allow-run-as-root (Open MPI refuses root otherwise)" >&2
      ;;
  esac
fi
# Job control gives the background job a process group of its own.
set -m
"$launcher" "${root_args[@]}" "$@" &
job=$!
set +m
stops=0
stop() {
  stops=$((stops + 1))
  if ((stops == 1)); then
    echo "[mpirun.sh] stopping: every rank writes a checkpoint at the next step boundary" \
      "(Ctrl-C again to end the job now, losing the work since the last checkpoint)" >&2
    kill -USR1 "$job" 2>/dev/null
  else
    echo "[mpirun.sh] ending the job now" >&2
    kill -TERM "$job" 2>/dev/null
  fi
}
trap stop INT TERM HUP
# `wait` returns early (above 128) when a trapped signal arrives: wait until the job has ended.
while :; do
  wait "$job"
  code=$?
  kill -0 "$job" 2>/dev/null || break
done
exit "$code"
