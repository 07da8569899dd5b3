#!/usr/bin/env bash
# Worker scaling of one training step (fp32, or bf16) on one node: for each worker count W, the same
# global batch trained by one rank with W worker threads (--threads W) and by W ranks x 1 worker
# (mpirun -np W --bind-to core), interleaved over --repeats rounds (medians). Issue 44.
#
# Configurations (--configs, comma-separated; the global batch is --batch sequences for both):
#   124M  gpt2-124M   L12 H12 C768, V 50257 (GPT-2 BPE, random weights), T 1024, 3 timed steps
#   d6    d6-char     L6  H6  C384, V 65 (characters), T 256, 5 timed steps
#   124M-bf16, d6-bf16  the same with --precision bf16 (matrix products in bf16)
# W = 1 is one run (1 rank x 1 worker), the baseline of both layouts. Each run does 2 untimed
# warm-up steps; its tok/s is train_gpt2's benchmark line (the median timed step).
#
# Usage: dev/bench_scaling.sh [--workers 1,2,4,8,16] [--configs 124M,d6] [--batch 16]
#          [--steps N] [--seq-len T] [--repeats 3] [--out-dir DIR] [--oversubscribe]
#          [--timeout S] [--plot-only]
#   --workers L      worker counts (default 1,2,4,8,16, those above `nproc` left out with a note;
#                    a count above nproc given here is refused unless --oversubscribe)
#   --batch B        global sequences per step (default 16); every W must divide it
#   --steps N        timed steps per run (default 3 for 124M, 5 for d6)
#   --seq-len T      every configuration at context T instead of its own (short checks)
#   --repeats R      rounds over all runs (default 3); the table shows medians
#   --out-dir D      where results go (default bench-scaling/); runs already recorded there
#                    are kept and merged, so a sweep can be split over several calls
#                    (e.g. --workers 1 in one, --workers 2,4,8,16 in the next)
#   --oversubscribe  allow W above nproc (ranks bound with core:overload-allowed)
#   --timeout S      stop a run after S seconds (default 3600)
#   --plot-only      only redraw the table, CSV and plot from D's recorded runs
#
# Columns: tok/s (median over rounds); speedup = tok/s / tok/s of 1 worker; efficiency =
# speedup / W; vs ranks = threads' tok/s / ranks' tok/s at the same W (threads rows); peak RSS
# = the sum of every rank's peak resident set (train_gpt2 --log-level debug, 'done' line);
# barrier = each worker's wait at the reduction's barriers per step (mean over workers, and the
# largest worker's), ms; reduction = (thread reduction + allreduce) / step time, the phases
# from train_gpt2's debug timing line (mean over ranks and timed steps); with W ranks the
# allreduce includes waiting for the slowest rank; fwd/bwd, thread red., allreduce, optimizer:
# the phases' ms per step.
#
# Writes to D: scaling.md (the table, with the CPU), scaling.csv (the table's rows), runs.csv
# (every run), scaling.png (tok/s and efficiency against W, threads vs ranks, one column of
# panels per configuration; needs /usr/bin/python3 with matplotlib, else skipped with a note:
# copy D to a machine that has it and run --plot-only there), logs/ (every run's output).
#
# Needs, and builds nothing: build/train_gpt2 (ninja -C build train_gpt2), mpirun (Open MPI),
# awk, timeout, data/tinyshakespeare.txt, and for 124M data/gpt2/encoder.json and vocab.bpe
# (scripts/get_gpt2_tokenizer.sh). On a node without the toolchain or the libraries:
# dev/device_bundle.sh pack here, then there: bash dev/device_bundle.sh run -- dev/bench_scaling.sh ...
set -euo pipefail
# --help: this header.
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
  exit 0
fi

me=bench_scaling.sh
usage_line="usage: dev/bench_scaling.sh [--workers 1,2,4,8,16] [--configs 124M,d6] [--batch 16] [--steps N] [--seq-len T] [--repeats R] [--out-dir DIR] [--oversubscribe] [--timeout S] [--plot-only] (--help: more)"
bad() { echo "$me: $* ($usage_line)" >&2; exit 2; }
die() { echo "$me: $*" >&2; exit 1; }
positive() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || bad "$1 must be a positive whole number, not '$2'"; }

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
workers_arg="" configs="124M,d6" batch=16 steps="" seq_len="" repeats=3 out_dir=""
oversubscribe=0 timeout_s=3600 plot_only=0
value() { [[ $# -ge 2 && "$2" != --* ]] || bad "$1 needs a value"; }
while (($#)); do
  case "$1" in
    --workers) value "$@"; workers_arg=$2; shift 2 ;;
    --configs) value "$@"; configs=$2; shift 2 ;;
    --batch) value "$@"; positive --batch "$2"; batch=$2; shift 2 ;;
    --steps) value "$@"; positive --steps "$2"; steps=$2; shift 2 ;;
    --seq-len) value "$@"; positive --seq-len "$2"; seq_len=$2; shift 2 ;;
    --repeats) value "$@"; positive --repeats "$2"; repeats=$2; shift 2 ;;
    --out-dir) value "$@"; out_dir=$2; shift 2 ;;
    --timeout) value "$@"; positive --timeout "$2"; timeout_s=$2; shift 2 ;;
    --oversubscribe) oversubscribe=1; shift ;;
    --plot-only) plot_only=1; shift ;;
    *) bad "unknown flag $1" ;;
  esac
done

cores=$(nproc)
IFS=',' read -r -a config_list <<<"$configs"
((${#config_list[@]})) || bad "--configs needs at least one of 124M, d6"
for c in "${config_list[@]}"; do
  [[ "$c" =~ ^(124M|d6)(-bf16)?$ ]] || bad "--configs takes 124M and/or d6 (each with -bf16 or not), not '$c'"
done
workers=()
if [[ -n "$workers_arg" ]]; then
  IFS=',' read -r -a workers <<<"$workers_arg"
  ((${#workers[@]})) || bad "--workers needs at least one count"
  for w in "${workers[@]}"; do
    [[ "$w" =~ ^[1-9][0-9]*$ ]] || bad "--workers takes positive whole numbers, not '$w'"
    ((w <= cores || oversubscribe)) ||
      bad "--workers $w exceeds the $cores cores here (nproc); --oversubscribe runs it anyway"
  done
else
  skipped=()
  for w in 1 2 4 8 16; do
    if ((w <= cores || oversubscribe)); then workers+=("$w"); else skipped+=("$w"); fi
  done
  ((plot_only || ${#skipped[@]} == 0)) ||
    echo "note: W=$(IFS=,; echo "${skipped[*]}") left out: more than the $cores cores here (--oversubscribe runs them)"
fi
for w in "${workers[@]}"; do
  ((batch % w == 0)) || bad "--batch $batch is not a multiple of worker count $w (the global batch is split evenly)"
done
mapfile -t workers < <(printf '%s\n' "${workers[@]}" | sort -nu)

# What the runs need, before anything is written.
if ((!plot_only)); then
  trainer="$repo/build/train_gpt2"
  [[ -x "$trainer" ]] || die "$trainer is missing: build it (ninja -C build train_gpt2) or copy it there"
  command -v mpirun >/dev/null || die "mpirun not found (Open MPI: apt-get install openmpi-bin)"
  command -v timeout >/dev/null || die "timeout (coreutils) not found"
  data="$repo/data/tinyshakespeare.txt"
  [[ -s "$data" ]] || die "$data is missing (scripts/setup.sh fetches it)"
  for c in "${config_list[@]}"; do
    if [[ "$c" == 124M* ]]; then
      for f in encoder.json vocab.bpe; do
        [[ -s "$repo/data/gpt2/$f" ]] || die "$repo/data/gpt2/$f is missing (scripts/get_gpt2_tokenizer.sh), needed by --configs 124M"
      done
    fi
  done
fi

out_dir="${out_dir:-bench-scaling}"
((!plot_only)) || [[ -s "$out_dir/runs.csv" ]] || die "$out_dir/runs.csv: no runs recorded yet (run without --plot-only first)"
mkdir -p "$out_dir/logs" || die "$out_dir: cannot create the output directory"
out_dir="$(cd "$out_dir" && pwd)"
runs_csv="$out_dir/runs.csv"
runs_header="config,seq_len,batch,steps,layout,workers,round,tok_s,peak_rss_mib,forward_backward_ms,thread_reduction_ms,allreduce_ms,optimizer_ms,step_ms,barrier_mean_ms,barrier_max_ms,reduction_share,log"
if [[ -f "$runs_csv" ]]; then
  [[ "$(head -n1 "$runs_csv")" == "$runs_header" ]] || die "$runs_csv: not this script's runs file (another header); give another --out-dir"
else
  echo "$runs_header" >"$runs_csv"
fi

# The CPU model and its topology, as lscpu states them.
lscpu_line() {
  local model
  model="$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n1)"
  lscpu | awk -F: -v model="${model:-unknown CPU}" -v nproc="$(nproc)" '
    /^CPU\(s\)/ {n = $2} /^Core\(s\) per socket/ {c = $2} /^Socket\(s\)/ {s = $2} /^Thread\(s\) per core/ {t = $2}
    END {gsub(/ /, "", n); gsub(/ /, "", c); gsub(/ /, "", s); gsub(/ /, "", t)
         printf "%s, %s CPUs (%s socket(s) x %s cores x %s thread(s)), nproc %s\n", model, n, s, c, t, nproc}'
}

# The commit measured: the checkout's, or where there is no git (a copy of the tree on a lent
# node), the one dev/device_bundle.sh recorded beside the build/train_gpt2 it linked.
built_from() {
  local commit trainer_path
  if commit="$(git -C "$repo" rev-parse --short HEAD 2>/dev/null)"; then echo "$commit"; return; fi
  trainer_path="$(readlink -f "$repo/build/train_gpt2" 2>/dev/null || true)"
  commit="$(dirname "$(dirname "${trainer_path:-/}")")/commit"
  if [[ -n "$trainer_path" && -s "$commit" ]]; then echo "$(cat "$commit") (device bundle)"; else echo unknown; fi
}

# ---- one run's figures from its log ---------------------------------------------------------------
# Prints tok_s,rss_mib,fb,thr,allr,opt,step,barrier_mean,barrier_max,share (empty fields where the
# log lacks a figure). Steps after the 2 warm-up steps only.
parse_log() {
  awk '
    function mib(v, u) { return u ~ /^G/ ? v * 1024 : u ~ /^K/ ? v / 1024 : v }
    / tok\/s \| .*peak RSS / && /^benchmark: / {
      for (i = 1; i <= NF; i++) {
        if ($i == "tok/s") tok = $(i - 1)
        if ($i == "RSS") { bench_rss = mib($(i + 1), $(i + 2)) }
      }
    }
    / done after .* \| peak RSS / { n = split($0, f, "peak RSS "); split(f[n], v, " "); rss += mib(v[1], v[2]); have_rss = 1 }
    match($0, /step [0-9]+\/[0-9]+ \| loss /) {
      split(substr($0, RSTART + 5), sp, "/"); st = sp[1] + 0
      if (st > 2 && match($0, /\| [0-9.]+ ms \|/)) { step_sum += substr($0, RSTART + 2, RLENGTH - 7); step_n++ }
    }
    match($0, /rank [0-9]+ step [0-9]+: forward\/backward /) {
      split(substr($0, RSTART), h, " "); st = h[4] + 0
      if (st <= 2) next
      line = substr($0, RSTART)
      split(line, parts, " \\| ")
      for (p in parts) {
        if (match(parts[p], /forward\/backward [0-9.]+/)) fb += substr(parts[p], RSTART + 17, RLENGTH - 17)
        else if (match(parts[p], /^thread reduction [0-9.]+/)) thr += substr(parts[p], 18, RLENGTH - 17)
        else if (match(parts[p], /^allreduce [0-9.]+/)) allr += substr(parts[p], 11, RLENGTH - 10)
        else if (match(parts[p], /^optimizer [0-9.]+/)) opt += substr(parts[p], 11, RLENGTH - 10)
        else if (match(parts[p], /^barrier wait per worker [0-9.\/]+/)) {
          nw = split(substr(parts[p], 25, RLENGTH - 24), b, "/")
          rk = h[2]
          for (k = 1; k <= nw; k++) { key = rk "/" k; wait[key] += b[k]; bsum += b[k]; bn++ }
        }
      }
      phases_n++
      steps_seen[st] = 1
    }
    END {
      if (!have_rss) rss = bench_rss
      ns = 0; for (s in steps_seen) ns++
      maxw = ""
      for (key in wait) { m = wait[key] / ns; if (maxw == "" || m > maxw) maxw = m }
      if (phases_n) {
        fbm = fb / phases_n; thrm = thr / phases_n; allrm = allr / phases_n; optm = opt / phases_n
      }
      stepm = step_n ? step_sum / step_n : ""
      share = (phases_n && step_n && stepm > 0) ? (thrm + allrm) / stepm : ""
      fmt2 = "%.1f"
      printf "%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n", tok, (rss == "" ? "" : sprintf("%.1f", rss)),
        (phases_n ? sprintf(fmt2, fbm) : ""), (phases_n ? sprintf(fmt2, thrm) : ""),
        (phases_n ? sprintf(fmt2, allrm) : ""), (phases_n ? sprintf(fmt2, optm) : ""),
        (stepm == "" ? "" : sprintf(fmt2, stepm)), (bn ? sprintf("%.2f", bsum / bn) : ""),
        (maxw == "" ? "" : sprintf("%.2f", maxw)), (share == "" ? "" : sprintf("%.4f", share))
    }' "$1"
}

# ---- the runs ----------------------------------------------------------------------------------
if ((!plot_only)); then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  physical=$(lscpu | awk -F: '/^Core\(s\) per socket/ {c = $2} /^Socket\(s\)/ {s = $2} END {print (c * s > 0) ? c * s : 0}')
  ((physical > 0)) || physical=$cores

  run_one() {  # config T steps layout W round
    local c=$1 t=$2 n=$3 layout=$4 w=$5 r=$6 model tok log rc=0 figures precision=fp32
    [[ "$c" == *-bf16 ]] && precision=bf16
    if [[ "$c" == 124M* ]]; then
      model=(--model gpt2-124M)
      tok=(--tokenizer gpt2 --tokenizer-dir "$repo/data/gpt2")
    else
      model=(--n-layer 6 --n-head 6 --n-embd 384 --block-size "$((t > 256 ? t : 256))")
      tok=(--tokenizer char)
    fi
    local train=("$trainer" --optimizer adamw "${model[@]}" "${tok[@]}" --data "$data" --seq-len "$t"
      --lr 3e-4 --min-lr 3e-4 --schedule constant --warmup-steps 0 --val-every 0
      --sample-every 0 --checkpoint-every 0 --out-dir "$out_dir/logs/out" --benchmark "$n"
      --precision "$precision" --log-level debug)
    log="$out_dir/logs/$c-T$t-B$batch-$layout-W$w-r$r.log"
    local cmd
    if [[ "$layout" == threads ]]; then
      cmd=("${train[@]}" --batch-size "$batch" --threads "$w")
    else
      local bind=(--map-by core --bind-to core)
      if ((w > cores)); then bind=(--map-by core --bind-to core:overload-allowed)
      elif ((w > physical)); then bind=(--map-by hwthread --bind-to hwthread); fi
      cmd=(mpirun --oversubscribe -np "$w" "${bind[@]}" "${train[@]}" --batch-size "$((batch / w))" --threads 1)
    fi
    { echo "\$ ${cmd[*]}"; echo; } >"$log"
    timeout --kill-after=30 "$timeout_s" "${cmd[@]}" >>"$log" 2>&1 || rc=$?
    figures="$(parse_log "$log")"
    if ((rc != 0)) || [[ "${figures%%,*}" == "" ]]; then
      echo "  $c T=$t $layout W=$w round $r: FAILED (exit $rc; $log):" >&2
      tail -n 5 "$log" | sed 's/^/    | /' >&2
      failures=$((failures + 1))
      return 0
    fi
    echo "$c,$t,$batch,$n,$layout,$w,$r,$figures,${log#"$out_dir/"}" >>"$runs_csv"
    IFS=, read -r tok_s rss _ _ _ _ step_ms bmean _ share <<<"$figures"
    printf '  %-4s T=%-4s %-7s W=%-3s round %s: %9s tok/s | peak RSS %s MiB | step %s ms | barrier %s ms | reduction %s\n' \
      "$c" "$t" "$layout" "$w" "$r" "$tok_s" "${rss:-?}" "${step_ms:-?}" "${bmean:-?}" "${share:-?}"
  }

  # The machine, kept with the runs so that --plot-only elsewhere names the one measured.
  lscpu_line >"$out_dir/machine.txt"
  echo "== worker scaling: $(cat "$out_dir/machine.txt") =="
  echo "configs ${configs}, W ${workers[*]}, global batch $batch, repeats $repeats; logs in $out_dir/logs"
  echo "load $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min): other work on these cores skews the figures"
  failures=0
  for ((r = 1; r <= repeats; r++)); do
    for c in "${config_list[@]}"; do
      if [[ "$c" == 124M* ]]; then t=1024 n=3; else t=256 n=5; fi
      t=${seq_len:-$t} n=${steps:-$n}
      for w in "${workers[@]}"; do
        run_one "$c" "$t" "$n" threads "$w" "$r"
        ((w == 1)) || run_one "$c" "$t" "$n" ranks "$w" "$r"
      done
    done
  done
  ((failures == 0)) || echo "$me: $failures run(s) failed; the table has the others" >&2
fi

# ---- the table, its CSV and the plot --------------------------------------------------------------
(($(wc -l <"$runs_csv") > 1)) || die "$runs_csv: no runs recorded yet"
if [[ -s "$out_dir/machine.txt" ]]; then machine="$(head -n1 "$out_dir/machine.txt")"; else machine="$(lscpu_line)"; fi
summary_csv="$out_dir/scaling.csv"
table_md="$out_dir/scaling.md"
# Medians over rounds per (config, T, batch, steps, layout, W); W=1 is both layouts' baseline.
awk -F, -v OFS=, '
  function median(list,   n, a, i, j, t) {
    n = split(list, a, " "); if (n == 0) return ""
    for (i = 2; i <= n; i++) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  NR == 1 { next }
  {
    g = $1 OFS $2 OFS $3 OFS $4; key = g OFS $5 OFS $6
    if (!(key in rounds)) { order[++nk] = key }
    rounds[key]++
    for (col = 8; col <= 17; col++) if ($col != "") vals[key, col] = vals[key, col] " " $col
    if ($6 == 1) base_key[g] = key
  }
  END {
    print "config,seq_len,batch,steps,layout,workers,rounds,tok_s,speedup,efficiency,threads_vs_ranks,peak_rss_mib,forward_backward_ms,thread_reduction_ms,allreduce_ms,optimizer_ms,step_ms,barrier_mean_ms,barrier_max_ms,reduction_share"
    for (i = 1; i <= nk; i++) {
      key = order[i]; split(key, k, OFS); g = k[1] OFS k[2] OFS k[3] OFS k[4]
      tok = median(vals[key, 8]); base = (g in base_key) ? median(vals[base_key[g], 8]) : ""
      sp = (base != "" && base > 0) ? sprintf("%.2f", tok / base) : ""
      ef = sp != "" ? sprintf("%.2f", sp / k[6]) : ""
      other = g OFS "ranks" OFS k[6]
      vr = (k[5] == "threads" && k[6] > 1 && (other in rounds)) ? sprintf("%.2f", tok / median(vals[other, 8])) : ""
      line = key OFS rounds[key] OFS sprintf("%.1f", tok) OFS sp OFS ef OFS vr
      for (col = 9; col <= 17; col++) line = line OFS median(vals[key, col])
      print line
    }
  }' "$runs_csv" | { IFS= read -r header; echo "$header"; sort -t, -k1,1 -k2,2n -k6,6n -k5,5r; } >"$summary_csv"

{
  echo "## Worker scaling of train_gpt2"
  echo
  echo "$machine; $(date '+%Y-%m-%d'); git $(built_from)"
  awk -F, '
    function f(v, digits) { return v == "" ? "" : sprintf("%." digits "f", v) }
    NR == 1 { next }
    {
      g = $1 " T=" $2 " B=" $3
      if (g != last) {
        name = ($1 ~ /^124M/ ? "gpt2-124M (L12 H12 C768, V 50257)" : "d6 (L6 H6 C384, V 65)") ($1 ~ /-bf16$/ ? ", bf16" : ", fp32")
        printf "\n### %s, T=%s, global batch %s sequences (%d tokens/step), %s timed steps, medians of %s round(s)\n\n", name, $2, $3, $2 * $3, $4, $7
        print "| W | layout | tok/s | speedup | efficiency | vs ranks | peak RSS MiB | barrier ms (mean / max) | reduction | fwd/bwd ms | thread red. ms | allreduce ms | optimizer ms |"
        print "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
        last = g
      }
      layout = $6 == 1 ? "1 rank x 1 worker" : $5 == "threads" ? "1 rank x " $6 " workers" : $6 " ranks x 1 worker"
      share = $20 == "" ? "" : sprintf("%.1f%%", 100 * $20)
      # Medians of an even number of rounds are means of two: printed to the same digits as one.
      printf "| %s | %s | %.0f | %s | %s | %s | %s | %s / %s | %s | %s | %s | %s | %s |\n", $6, layout, $8, $9, $10, $11, f($12, 1), f($18, 2), f($19, 2), share, f($13, 1), f($14, 1), f($15, 1), f($16, 1)
    }' "$summary_csv"
} >"$table_md"
echo
cat "$table_md"
echo
echo "table: $table_md | CSV: $summary_csv | every run: $runs_csv"

py=/usr/bin/python3
if [[ -x "$py" ]] && "$py" -c 'import matplotlib' 2>/dev/null; then
  "$py" - "$summary_csv" "$out_dir/scaling.png" "$machine" <<'EOF'
import csv, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

rows = list(csv.DictReader(open(sys.argv[1])))
groups = []
for r in rows:
    g = (r["config"], r["seq_len"], r["batch"])
    if g not in groups:
        groups.append(g)
fig, axes = plt.subplots(2, len(groups), figsize=(5.5 * len(groups), 8), squeeze=False)
for col, g in enumerate(groups):
    mine = [r for r in rows if (r["config"], r["seq_len"], r["batch"]) == g]
    base = [r for r in mine if r["workers"] == "1"]
    for layout, style in (("threads", "o-"), ("ranks", "s--")):
        pts = sorted(((int(r["workers"]), r) for r in mine
                      if (r["layout"] == layout or r["workers"] == "1") and r["tok_s"]),
                     key=lambda p: p[0])
        label = "1 rank x W workers" if layout == "threads" else "W ranks x 1 worker"
        axes[0][col].plot([w for w, _ in pts], [float(r["tok_s"]) for _, r in pts], style, label=label)
        eff = [(w, float(r["efficiency"])) for w, r in pts if r["efficiency"]]
        axes[1][col].plot([w for w, _ in eff], [e for _, e in eff], style, label=label)
    ws = sorted({int(r["workers"]) for r in mine})
    if base and base[0]["tok_s"]:
        axes[0][col].plot(ws, [float(base[0]["tok_s"]) * w for w in ws], ":", color="grey", label="ideal")
    axes[1][col].axhline(1.0, linestyle=":", color="grey")
    name = ("gpt2-124M" if g[0].startswith("124M") else "d6 (L6 H6 C384)") + (
        ", bf16" if g[0].endswith("-bf16") else "")
    axes[0][col].set_title(f"{name}, T={g[1]}, global batch {g[2]}")
    axes[0][col].set_ylabel("tokens/s")
    axes[0][col].set_ylim(bottom=0)
    axes[1][col].set_ylabel("efficiency (speedup / W)")
    axes[1][col].set_ylim(0, 1.1)
    for ax in (axes[0][col], axes[1][col]):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ws, [str(w) for w in ws])
        ax.set_xlabel("workers W")
        ax.grid(True, alpha=0.3)
        ax.legend()
fig.suptitle("train_gpt2 worker scaling\n" + sys.argv[3].replace(", ", ",\n", 1), fontsize=10)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
EOF
  echo "plot: $out_dir/scaling.png"
else
  echo "plot: skipped (no /usr/bin/python3 with matplotlib here): copy $out_dir elsewhere and run dev/bench_scaling.sh --plot-only --out-dir DIR"
fi
