#!/usr/bin/env bash
# Simulated hosts on one machine: network namespaces joined through a bridge by veth links shaped
# with tc (rate-limited both ways), so MPI ranks in different "hosts" talk over real TCP and share
# no memory. Addresses (10.77.0.0/24) exist only inside the rig's namespaces. Needs root.
#   scripts/multihost_rig.sh up NAME HOSTS RATE     e.g. up rig1 2 1gbit (RATE as tc, or "none")
#   scripts/multihost_rig.sh mpirun NAME ARGS...    mpirun in host 1, one slot per host (RIG_SLOTS),
#                                                   unbound (the "hosts" share this machine's CPUs)
#   scripts/multihost_rig.sh kill-host NAME I       SIGKILL every process of host I
#   scripts/multihost_rig.sh down NAME              remove the namespaces (and so the links)
# Exit 77 when the machine cannot make namespaces (not root, no `ip netns`).
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
(($# >= 2)) || usage
command=$1 name=$2
shift 2
[[ $name =~ ^[a-z0-9]{1,8}$ ]] || { echo "multihost_rig: NAME must be 1-8 of [a-z0-9]" >&2; exit 2; }

hosts_of() { ip netns list | sed -n "s/^\(${name}h[0-9][0-9]*\)\( .*\)\{0,1\}\$/\1/p"; }

case $command in
  up)
    (($# == 2)) || usage
    hosts=$1 rate=$2
    [[ $hosts =~ ^[1-8]$ ]] || { echo "multihost_rig: HOSTS must be 1-8" >&2; exit 2; }
    if [[ $EUID -ne 0 ]] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
      echo "multihost_rig: skipped: needs root, ip and tc" >&2
      exit 77
    fi
    if ip netns list | grep -q "^${name}sw\b"; then
      echo "multihost_rig: a rig named $name exists: run '$0 down $name' first" >&2
      exit 1
    fi
    if ! ip netns add "${name}sw" 2>/dev/null; then
      echo "multihost_rig: skipped: this machine cannot create network namespaces" >&2
      exit 77
    fi
    trap '"$here/scripts/multihost_rig.sh" down "$name"' ERR  # a half-built rig is removed
    ip -n "${name}sw" link add br0 type bridge
    ip -n "${name}sw" link set br0 up
    ip -n "${name}sw" link set lo up
    shape() {  # namespace, device
      [[ $rate == none ]] || ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$rate" burst 256kb latency 50ms
    }
    for ((i = 1; i <= hosts; i++)); do
      ns="${name}h$i"
      ip netns add "$ns"
      ip link add "${name}h$i" type veth peer name "${name}s$i"
      ip link set "${name}h$i" netns "$ns"
      ip link set "${name}s$i" netns "${name}sw"
      ip -n "$ns" link set lo up
      ip -n "$ns" addr add "10.77.0.$i/24" dev "${name}h$i"
      ip -n "$ns" link set "${name}h$i" up
      ip -n "${name}sw" link set "${name}s$i" master br0
      ip -n "${name}sw" link set "${name}s$i" up
      shape "$ns" "${name}h$i"
      shape "${name}sw" "${name}s$i"
    done
    echo "rig $name: $hosts hosts 10.77.0.1-$hosts, links $rate"
    ;;
  mpirun)
    mapfile -t namespaces < <(hosts_of)
    ((${#namespaces[@]} > 0)) || { echo "multihost_rig: no rig named $name (run: up $name HOSTS RATE)" >&2; exit 1; }
    slots=${RIG_SLOTS:-1}
    list=""
    for ((i = 1; i <= ${#namespaces[@]}; i++)); do list+="${list:+,}10.77.0.$i:$slots"; done
    root=()
    [[ $EUID -ne 0 ]] || root=(--allow-run-as-root)
    GPT2_RIG=$name exec ip netns exec "${name}h1" mpirun "${root[@]}" --host "$list" \
      --mca plm_rsh_agent "$here/scripts/netns_agent.sh" --mca btl tcp,self \
      --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
      --bind-to none "$@"
    ;;
  kill-host)
    (($# == 1)) || usage
    pids=$(ip netns pids "${name}h$1" || true)
    [[ -z $pids ]] || kill -9 $pids
    ;;
  down)
    for ns in $(hosts_of) "${name}sw"; do
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      [[ -z $pids ]] || kill -9 $pids 2>/dev/null || true
      ip netns del "$ns" 2>/dev/null || true
    done
    ;;
  *) usage ;;
esac
