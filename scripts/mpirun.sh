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
# script tells it (--allow-run-as-root) unless OMPI_ALLOW_RUN_AS_ROOT is set.
# Our programs say what went wrong in one line and choose their exit code (2: a bad command line,
# 1: a failure at run time); Open MPI's banners that only repeat that a rank exited non-zero or
# called MPI_Abort are left out of mpirun's stderr (GPT2_MPIRUN_BANNERS=1 keeps them); everything
# else it says (too few slots, a program not found, a rank killed by a signal) passes through.
# Exit: mpirun's exit code, which is the program's.
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
      ;;
  esac
fi
# Open MPI's dash-framed banners that follow a rank's own error line (a non-zero exit, MPI_Abort)
# are dropped; any other block, and every other line, is passed on as it comes.
filter_banners() {
  awk '
    function flush_block(drop) {
      if (!drop) printf "%s", block
      block = ""; inside = 0; lines = 0; fflush()
    }
    length($0) >= 40 && /^-+$/ {
      if (!inside) { inside = 1; block = $0 "\n"; next }
      block = block $0 "\n"
      flush_block(block ~ /Primary job +terminated normally|MPI_ABORT was invoked|mpirun detected that one or more processes exited with non-zero status/)
      next
    }
    inside { block = block $0 "\n"; if (++lines > 60) flush_block(0); next }
    # Open MPI 4.1 sometimes adds a line of its own after an MPI_Abort, its help message
    # aggregation racing the abort ("Data unpack would read past end of buffer", "Data unpack had
    # inadequate space", "Out of resource" ... in show_help.c): nothing the user can act on.
    /ORTE_ERROR_LOG: .* in file .*show_help\.c/ { next }
    { print; fflush() }
    END { if (inside) printf "%s", block }
  '
}
# A stop asked for from here on is kept, even before mpirun has started.
stops=0
job=
stop() {
  stops=$((stops + 1))
  if ((stops == 1)); then
    echo "[mpirun.sh] stopping: every rank writes a checkpoint at the next step boundary" \
      "(Ctrl-C again to end the job now, losing the work since the last checkpoint)" >&2
  else
    echo "[mpirun.sh] ending the job now" >&2
    [[ -n "$job" ]] && kill -TERM "$job" 2>/dev/null
  fi
}
trap stop INT TERM HUP
# Job control gives the background job a process group of its own.
set -m
# mpirun's stderr goes through a FIFO to the filter, so that both can be waited for; without a
# FIFO (no temporary directory), unfiltered.
fifo_dir=""
if [[ "${GPT2_MPIRUN_BANNERS:-0}" != "1" ]] && fifo_dir=$(mktemp -d "${TMPDIR:-/tmp}/mpirun.sh.XXXXXX" 2>/dev/null) &&
  mkfifo "$fifo_dir/stderr" 2>/dev/null; then
  trap 'rm -rf "$fifo_dir"' EXIT
  filter_banners < "$fifo_dir/stderr" >&2 &
  filter=$!
  "$launcher" "${root_args[@]}" "$@" 2> "$fifo_dir/stderr" &
  job=$!
else
  [[ -n "$fifo_dir" ]] && rm -rf "$fifo_dir"
  "$launcher" "${root_args[@]}" "$@" &
  job=$!
fi
set +m
((stops >= 2)) && kill -TERM "$job" 2>/dev/null
# Whether every rank of this machine (mpirun's children with OMPI_COMM_WORLD_RANK in their
# environment: as many as their OMPI_COMM_WORLD_LOCAL_SIZE says, so that a rank mpirun has not
# started yet is waited for too) catches SIGUSR1 yet: a rank that has not reached its main()
# would be ended by it (exit 138, "exited on signal 10").
ranks_catch_usr1() {
  local pid mask found=0 local_size=1 size
  for pid in $(pgrep -P "$job" 2>/dev/null); do
    grep -qz '^OMPI_COMM_WORLD_RANK=' "/proc/$pid/environ" 2>/dev/null || continue
    found=$((found + 1))
    size=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null |
      sed -n 's/^OMPI_COMM_WORLD_LOCAL_SIZE=\([0-9]*\)$/\1/p')
    [[ -n "$size" ]] && ((size > local_size)) && local_size=$size
    mask=$(awk '/^SigCgt:/ { print $2 }' "/proc/$pid/status" 2>/dev/null)
    [[ -n "$mask" ]] && (((16#$mask >> 9) & 1)) || return 1
  done
  ((found >= local_size))
}
# `wait` returns early (above 128) when a trapped signal arrives: wait until the job has ended.
# Once a stop is asked for, SIGUSR1 goes to mpirun when this machine's ranks catch it (or after 10
# seconds, for ranks elsewhere), then again every second until the job ends: mpirun passes a
# signal only to the ranks it has started (a rank stopping already takes a repeated one as the
# same stop).
code=0
waited=0
while :; do
  if ((stops == 1)); then
    if ((waited >= 100)) || ranks_catch_usr1; then
      kill -USR1 "$job" 2>/dev/null
      sleep 1 &
    else
      waited=$((waited + 1))
      sleep 0.1 &
    fi
    wait $! 2>/dev/null
  else
    wait "$job"
    code=$?
  fi
  kill -0 "$job" 2>/dev/null || break
done
if ((stops == 1)); then
  wait "$job"
  code=$?
fi
# The filter has printed everything once mpirun's stderr has closed.
[[ -n "${filter:-}" ]] && wait "$filter" 2>/dev/null
exit "$code"
