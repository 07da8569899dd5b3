#!/usr/bin/env bash
# mpirun's launcher agent for scripts/multihost_rig.sh (instead of ssh): "$1" is a host address of
# the rig named by $GPT2_RIG (10.77.0.I is namespace ${GPT2_RIG}hI); the rest is the command to run
# on it, which runs inside that network namespace with its own host name (as real hosts have: Open
# MPI 4.1 crashed in MPI_Comm_split_type when two "hosts" shared one name).
set -euo pipefail
host=$1
shift
[[ -n ${GPT2_RIG:-} ]] || { echo "netns_agent.sh: GPT2_RIG is not set" >&2; exit 1; }
[[ $host =~ ^10\.77\.0\.([0-9]+)$ ]] || { echo "netns_agent.sh: $host is not a rig address" >&2; exit 1; }
exec ip netns exec "${GPT2_RIG}h${BASH_REMATCH[1]}" unshare --uts /bin/sh -c "hostname ${GPT2_RIG}h${BASH_REMATCH[1]} && $*"
