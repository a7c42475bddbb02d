#!/usr/bin/env bash
# A real single-node Slurm 22.05 cluster on this machine (Debian's slurmctld + slurmd), without
# munge or systemd, all state, logs and pid files under DIR. Idempotent; `down` stops only the
# daemons whose pid files it wrote.
#
#   scripts/cluster/slurm-local.sh up DIR [CPUS]   start (CPUS advertised, default 8: oversubscribes cores)
#   scripts/cluster/slurm-local.sh status DIR      daemons and sinfo
#   scripts/cluster/slurm-local.sh down DIR        stop
#   export SLURM_CONF=DIR/slurm.conf       then use sbatch, squeue, scontrol, scancel as usual
set -euo pipefail
cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { sed -n '2,10p' "$0"; exit 2; }
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
conf=$dir/slurm.conf
export SLURM_CONF=$conf

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

case "$cmd" in
up)
  if alive "$dir/slurmctld.pid" && alive "$dir/slurmd.pid"; then echo "slurm-local: already up ($dir)"; exit 0; fi
  cpus=${3:-8}
  mkdir -p "$dir/state" "$dir/spool"
  cat > "$conf" <<CONF
# written by scripts/cluster/slurm-local.sh: a single-node cluster without munge or systemd
ClusterName=pipetrain-local
SlurmctldHost=localhost
$(cat "$(dirname "$0")/slurm-base.conf")
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
  alive "$dir/slurmctld.pid" || slurmctld -f "$conf" -i -c
  alive "$dir/slurmd.pid" || slurmd -f "$conf" -N localhost -c
  for _ in $(seq 1 50); do  # until the node accepts jobs
    state=$(sinfo -h -n localhost -o %t 2>/dev/null || true)
    case "$state" in idle*|mix*|alloc*) echo "slurm-local: up ($dir); export SLURM_CONF=$conf"; exit 0 ;; esac
    sleep 0.2
  done
  echo "slurm-local: daemons started but the node is not idle (state '${state:-?}'); see $dir/*.log" >&2
  exit 1 ;;
down)
  for d in slurmd slurmctld; do
    if alive "$dir/$d.pid"; then
      pid=$(cat "$dir/$d.pid"); kill "$pid"
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$dir/$d.pid"
  done
  echo "slurm-local: down ($dir)" ;;
status)
  for d in slurmctld slurmd; do
    if alive "$dir/$d.pid"; then echo "$d: running (pid $(cat "$dir/$d.pid"))"; else echo "$d: stopped"; fi
  done
  alive "$dir/slurmctld.pid" && sinfo || true ;;
*) echo "usage: $0 up|down|status DIR [CPUS]" >&2; exit 2 ;;
esac
