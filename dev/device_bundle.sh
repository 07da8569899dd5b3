#!/usr/bin/env bash
# Runs train_gpt2 and Open MPI's mpirun on a machine that has neither them nor their libraries (a
# lent many-core node with no package registry): `pack` gathers two portable builds of
# train_gpt2, mpirun, orted, lscpu and every shared library they load (glibc's loader included,
# so the node's own C library never mixes in) into one gzip tarball; `run` unpacks it there and
# runs a command with build/train_gpt2 and mpirun taken from it. Issue 44 (dev/bench_scaling.sh
# on 16 cores).
#
# Usage:
#   dev/device_bundle.sh pack [--out FILE] [--jobs N]      (here: Debian 12 with the toolchain)
#   dev/device_bundle.sh run [--bundle FILE] [--variant v3|v4] -- COMMAND...
#                                                          (there, in a copy of the repository)
#
# pack   builds build-bundle-v3 (-march=x86-64-v3: AVX2, FMA) and build-bundle-v4
#        (-march=x86-64-v4: AVX-512 F/BW/DQ/VL/CD), both Release without tests, and writes FILE
#        (default .deps/device-bundle.tar.gz, about 30 MB). Needs patchelf (apt-get install
#        patchelf): every program and library in the bundle is made to load from
#        /tmp/gpt2-bundle, where `run` puts it (and where pack unpacks it to check that mpirun
#        and train_gpt2 start from it before writing FILE).
# run    unpacks FILE to /tmp/gpt2-bundle (again only when FILE changed), links build/train_gpt2
#        to the build for this CPU (v4 where /proc/cpuinfo has the AVX-512 set, else v3; a
#        build/train_gpt2 that is not such a link is refused, never replaced; --variant chooses),
#        and runs COMMAND
#        with mpirun on PATH, Open MPI relocated there (OPAL_PREFIX) and allowed to run as root.
#        Nothing else is changed: the node's own bash, awk and coreutils run the scripts.
#
# With the device tool (carry the bundle and the data, which git ignores):
#   run(command="bash dev/device_bundle.sh run -- dev/bench_scaling.sh --workers 1,16",
#       carry=[".deps/device-bundle.tar.gz", "data/tinyshakespeare.txt", "data/gpt2"])
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
  exit 0
fi

me=device_bundle.sh
die() { echo "$me: $*" >&2; exit 1; }
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target=/tmp/gpt2-bundle   # fixed: the bundle's programs name their loader by this absolute path
bundle="$repo/.deps/device-bundle.tar.gz"
# What the bundle's programs run with: OPAL_PREFIX relocates Open MPI; PMIx is told where its
# components are (it has no such prefix); help texts are printed by each rank itself, because
# mpirun's aggregation of them failed from the bundle ("Data unpack would read past end of
# buffer" in place of MPI_ABORT's text); root may run it.
bundle_env=(OPAL_PREFIX="$target/usr"
  PMIX_MCA_mca_base_component_path="$target/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix"
  OMPI_MCA_orte_base_help_aggregate=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)

pack() {
  local jobs; jobs="$(nproc)"
  while (($#)); do
    case "$1" in
      --out) [[ $# -ge 2 ]] || die "--out needs a file"; bundle="$(realpath -m "$2")"; shift 2 ;;
      --jobs) [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || die "--jobs needs a positive number"; jobs="$2"; shift 2 ;;
      *) die "pack: unknown argument '$1' (--help)" ;;
    esac
  done
  command -v patchelf >/dev/null || die "patchelf not found (apt-get install patchelf)"
  local mpirun_real; mpirun_real="$(realpath "$(command -v mpirun)")" || die "mpirun not found"
  local ompi_plugins=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
  local pmix_plugins=/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
  [[ -d "$ompi_plugins" ]] || die "$ompi_plugins is missing (Debian 12's openmpi-bin 4.1)"

  local variant
  local -a launcher=()
  command -v ccache >/dev/null &&
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  for variant in v3 v4; do
    local width=""  # as GPT2_NATIVE builds vectorise on AVX-512 (CMakeLists.txt)
    [[ "$variant" == v4 ]] && width=-mprefer-vector-width=512
    cmake -S "$repo" -B "$repo/build-bundle-$variant" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
      -DGPT2_NATIVE=OFF -DGPT2_BUILD_TESTS=OFF -DCMAKE_CXX_FLAGS="-march=x86-64-$variant $width" \
      -DCMAKE_C_FLAGS="-march=x86-64-$variant $width" >/dev/null
    cmake --build "$repo/build-bundle-$variant" -j "$jobs" --target train_gpt2 >/dev/null
  done

  local stage; stage="$(mktemp -d)"
  trap 'rm -rf "$stage"' RETURN
  mkdir -p "$stage/bin" "$stage/lib" "$stage/usr/bin" "$stage/usr/share" \
    "$stage/usr/lib/x86_64-linux-gnu/openmpi/lib" "$stage/usr/lib/x86_64-linux-gnu/pmix2/lib"
  cp "$repo/build-bundle-v3/train_gpt2" "$stage/bin/train_gpt2-v3"
  cp "$repo/build-bundle-v4/train_gpt2" "$stage/bin/train_gpt2-v4"
  # Open MPI laid out as under /usr, so that OPAL_PREFIX=$target/usr finds its components and
  # help texts where its configuration says they are. Components that need libraries of
  # networks a single node does not use (UCX, libfabric, verbs, PSM) are left out.
  cp "$mpirun_real" "$stage/usr/bin/orterun"
  ln -s orterun "$stage/usr/bin/mpirun"
  cp "$(realpath /usr/bin/orted)" "$stage/usr/bin/orted"  # a process without mpirun starts one
  cp "$(realpath "$(command -v lscpu)")" "$stage/usr/bin/lscpu"  # bench_scaling.sh names the CPU
  cp -a "$ompi_plugins" "$stage/usr/lib/x86_64-linux-gnu/openmpi/lib/"
  [[ -d "$pmix_plugins" ]] && cp -a "$pmix_plugins" "$stage/usr/lib/x86_64-linux-gnu/pmix2/lib/"
  [[ -d "$pmix_plugins/../../share" ]] && cp -a "$pmix_plugins/../../share" "$stage/usr/lib/x86_64-linux-gnu/pmix2/"
  cp -a /usr/share/openmpi "$stage/usr/share/"
  local plugin
  for plugin in "$stage"/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so \
                "$stage"/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/*.so; do
    if ldd "$plugin" | grep -Eq 'libucp|libucs|libfabric|libibverbs|libpsm|librdmacm|not found'; then
      rm "$plugin"
    fi
  done

  # Every shared library any of them loads, and the loader itself, into lib/.
  local elf lib
  local -a programs=("$stage"/bin/* "$stage"/usr/bin/{orterun,orted,lscpu})
  local -a elves=("${programs[@]}" "$stage"/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so)
  [[ -d "$stage/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix" ]] &&
    elves+=("$stage"/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/*.so)
  for elf in "${elves[@]}"; do
    ldd "$elf" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/.*ld-linux/ {print $1}'
  done | sort -u | while read -r lib; do
    cp -L "$lib" "$stage/lib/$(basename "$lib")"
  done
  local loader; loader="$(basename "$(ls "$stage"/lib/ld-linux-x86-64.so.* | head -1)")"

  # Programs load through the bundle's loader; everything looks for its libraries in lib/ first.
  for elf in "${programs[@]}"; do
    patchelf --set-interpreter "$target/lib/$loader" --set-rpath "$target/lib" "$elf"
  done
  for elf in "$stage"/lib/*.so* "$stage"/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so \
             "$stage"/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/*.so; do
    [[ -e "$elf" && "$(basename "$elf")" != "$loader" ]] || continue
    patchelf --set-rpath "$target/lib" "$elf"
  done
  git -C "$repo" rev-parse --short HEAD > "$stage/commit" 2>/dev/null || echo unknown > "$stage/commit"

  mkdir -p "$(dirname "$bundle")"
  tar -C "$stage" -czf "$bundle.tmp" . || die "$bundle.tmp: cannot write"

  # Smoke test before it travels: unpacked where it will live, each program starts from it.
  rm -rf "$target" && mkdir -p "$target" && tar -C "$target" -xzf "$bundle.tmp"
  cksum < "$bundle.tmp" > "$target/.unpacked-from"
  env "${bundle_env[@]}" "$target/usr/bin/mpirun" --version >/dev/null ||
    die "the bundle's mpirun does not start"
  env "${bundle_env[@]}" "$target/bin/train_gpt2-v3" --version >/dev/null ||
    die "the bundle's v3 train_gpt2 does not start"
  if grep -qw avx512bw /proc/cpuinfo; then
    env "${bundle_env[@]}" "$target/bin/train_gpt2-v4" --version >/dev/null ||
      die "the bundle's v4 train_gpt2 does not start"
  fi
  mv "$bundle.tmp" "$bundle"
  echo "$me: wrote $bundle ($(du -h "$bundle" | cut -f1), train_gpt2 at $(cat "$stage/commit")); its programs start from $target"
}

run() {
  local variant=""
  while (($#)); do
    case "$1" in
      --variant) [[ "${2:-}" == v3 || "${2:-}" == v4 ]] || die "--variant is v3 or v4"; variant="$2"; shift 2 ;;
      --bundle) [[ $# -ge 2 ]] || die "--bundle needs a file"; bundle="$(realpath -m "$2")"; shift 2 ;;
      --) shift; break ;;
      *) die "run: expected -- before the command, not '$1' (--help)" ;;
    esac
  done
  (($#)) || die "run: no command after --"
  [[ -s "$bundle" ]] || die "$bundle is missing: make it with 'dev/device_bundle.sh pack' and carry it"
  # Everything that can refuse is checked before anything is unpacked or linked.
  local flags flag
  flags="$(grep -m1 '^flags' /proc/cpuinfo || true)"
  if [[ -z "$variant" ]]; then
    variant=v4
    for flag in avx512f avx512bw avx512dq avx512vl avx512cd; do
      [[ " $flags " == *" $flag "* ]] || variant=v3
    done
  fi
  local -a needs=(avx2 fma)
  [[ "$variant" == v4 ]] && needs+=(avx512f avx512bw avx512dq avx512vl avx512cd)
  for flag in "${needs[@]}"; do
    [[ " $flags " == *" $flag "* ]] || die "this CPU has no $flag: the bundle's $variant build needs it"
  done
  local link="$repo/build/train_gpt2"
  if [[ -e "$link" || -L "$link" ]]; then
    [[ -L "$link" && "$(readlink "$link")" == "$target"/bin/* ]] ||
      die "$link exists and is not the bundle's: move it away first"
  fi

  local stamp; stamp="$(cksum < "$bundle")"
  if [[ "$(cat "$target/.unpacked-from" 2>/dev/null)" != "$stamp" ]]; then
    rm -rf "$target" && mkdir -p "$target"
    tar -C "$target" -xzf "$bundle" || die "$bundle: not a bundle this script wrote (tar failed)"
    echo "$stamp" > "$target/.unpacked-from"
  fi
  mkdir -p "$repo/build"
  ln -sfn "$target/bin/train_gpt2-$variant" "$link"
  echo "$me: train_gpt2 $variant (built at $(cat "$target/commit")), Open MPI from $target/usr" >&2
  env PATH="$target/usr/bin:$PATH" "${bundle_env[@]}" "$@"
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  *) die "usage: dev/device_bundle.sh pack [--out FILE] [--jobs N] | run [--bundle FILE] [--variant v3|v4] -- COMMAND... (--help)" ;;
esac
