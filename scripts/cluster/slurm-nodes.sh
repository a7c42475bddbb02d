#!/usr/bin/env bash
# An emulated multi-node Slurm 22.05 cluster on this machine: each node is a Linux network
# namespace with its own private address on one bridge (no default route: nothing leaves the
# machine), its own hostname, its own IPC namespace and its own slurmd; slurmctld runs in the root
# namespace. MPI traffic between "nodes" is real TCP over the bridge. One such cluster per machine
# (fixed names and ports); all state, logs and pid files under DIR. Needs root.
#
#   scripts/cluster/slurm-nodes.sh up DIR N [CPUS] [accounting]
#                                                       start N nodes node1..nodeN (CPUS each, default 4);
#                                                       accounting: with slurmdbd and a MariaDB under DIR, so
#                                                       that sacct answers (a few seconds more)
#   scripts/cluster/slurm-nodes.sh down DIR             remove every namespace, bridge, veth and daemon
#   scripts/cluster/slurm-nodes.sh status DIR           daemons, links and sinfo
#   scripts/cluster/slurm-nodes.sh crash DIR NODE       power loss: link down, then SIGKILL all on NODE
#   scripts/cluster/slurm-nodes.sh revive DIR NODE      after crash: link up, slurmd again, node resumed
#   scripts/cluster/slurm-nodes.sh link-down DIR NODE   cut NODE's cable (processes keep running)
#   scripts/cluster/slurm-nodes.sh link-up DIR NODE     plug it back
#   scripts/cluster/slurm-nodes.sh slow DIR NODE RATE   limit NODE's outgoing bandwidth (e.g. 20mbit; off: no limit)
#   scripts/cluster/slurm-nodes.sh throttle DIR NODE PCT  cap NODE's processes (slurmd, so its jobs too) at PCT% of
#                                                       one CPU, as a throttled node would run (off: no cap)
#   scripts/cluster/slurm-nodes.sh pin DIR NODE CPUS    run NODE's processes (and jobs) on these host CPUs only
#                                                       (a list for taskset, e.g. 1 or 0-3), as a node has its own
#   scripts/cluster/slurm-nodes.sh exec DIR NODE CMD…   run CMD on NODE (its network, hostname and IPC)
#   export SLURM_CONF=DIR/slurm.conf            then sbatch/srun/squeue/scontrol from the root namespace
set -eEuo pipefail
cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { sed -n '2,22p' "$0"; exit 2; }
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
conf=$dir/slurm.conf
export SLURM_CONF=$conf

readonly prefix=ptc            # every namespace and link this script makes starts with it
readonly bridge=$prefix-br subnet=10.213.0 ctl_port=6917 node_port=6918 dbd_port=6919 db_port=6920

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# A node's CPU cap is a cpu cgroup of its own (v1 cpu controller, or v2 cpu.max) holding every
# process in its network namespace; what slurmd starts later is born in it.
cg_root() { if [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then echo /sys/fs/cgroup/cpu; else echo /sys/fs/cgroup; fi; }
cg_of() { echo "$(cg_root)/$prefix-$1"; }
uncap() {  # NODE: its processes back in the root cgroup, the cap removed
  local cg pid
  cg=$(cg_of "$1")
  [ -d "$cg" ] || return 0
  for pid in $(cat "$cg/cgroup.procs" 2>/dev/null); do echo "$pid" > "$(cg_root)/cgroup.procs" 2>/dev/null || true; done
  rmdir "$cg" 2>/dev/null || true
}
netns_of() { echo "$prefix-$1"; }
veth_of() { echo "$prefix-${1#node}"; }     # root-side end of NODE's cable (15-char limit)
need_node() {  # NODE must name a node of the cluster that is up
  [[ $1 =~ ^node[0-9]+$ ]] || { echo "slurm-nodes: no node '$1' (names are node1..nodeN)" >&2; exit 2; }
  ip netns list | grep -qw "$(netns_of "$1")" || { echo "slurm-nodes: $1 does not exist (is the cluster up?)" >&2; exit 2; }
}

# slurmd inside NODE: `ip netns exec` gives a mount namespace with a fresh /sys, so the cgroup v1
# tree slurmd 22.05 insists on is mounted again; `unshare --ipc` keeps UCX from using System V
# shared memory between "nodes" (with one IPC namespace it silently does); --uts for the hostname.
start_slurmd() {
  local node=$1
  ip netns exec "$(netns_of "$node")" unshare --ipc --uts -- sh -ec '
    hostname "$1"
    mount -t tmpfs cgroup_root /sys/fs/cgroup
    for c in cpu cpuacct cpuset memory devices freezer pids; do
      mkdir /sys/fs/cgroup/$c
      mount -t cgroup -o "$c" cgroup /sys/fs/cgroup/$c 2>/dev/null || rmdir /sys/fs/cgroup/$c
    done
    mkdir /sys/fs/cgroup/systemd && mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd
    mkdir -p "$2/spool/$1"
    exec slurmd -f "$3" -N "$1" -c' sh "$node" "$dir" "$conf"
}

# Job accounting for sacct: a MariaDB of its own (TCP on 127.0.0.1 only, no grant tables: a
# throwaway database nothing else can reach) and slurmdbd on it, both under DIR.
start_accounting() {
  mkdir -p "$dir/db"
  mariadb-install-db --user=root --datadir="$dir/db" --auth-root-authentication-method=normal --skip-test-db \
    > "$dir/mariadb-install.log" 2>&1
  mariadbd --user=root --datadir="$dir/db" --port=$db_port --bind-address=127.0.0.1 --socket="$dir/mariadb.sock" \
    --pid-file="$dir/mariadb.pid" --skip-grant-tables --log-error="$dir/mariadb.log" > /dev/null 2>&1 &
  for _ in $(seq 1 100); do mariadb-admin --protocol=tcp -h 127.0.0.1 -P $db_port ping > /dev/null 2>&1 && break; sleep 0.1; done
  cat > "$dir/slurmdbd.conf" <<CONF
# written by scripts/cluster/slurm-nodes.sh: accounting for the emulated cluster
AuthType=auth/none
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$dbd_port
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=root
StorageLoc=slurm_acct_db
PidFile=$dir/slurmdbd.pid
LogFile=$dir/slurmdbd.log
CONF
  chmod 600 "$dir/slurmdbd.conf"
  slurmdbd   # reads slurmdbd.conf beside $SLURM_CONF
  for _ in $(seq 1 100); do sacctmgr -n list cluster > /dev/null 2>&1 && return 0; sleep 0.1; done
  echo "slurm-nodes: slurmdbd did not answer; see $dir/slurmdbd.log" >&2
  return 1
}

wait_idle() {  # NODES...: until each accepts jobs
  local state=""
  for _ in $(seq 1 100); do
    state=$(sinfo -h -N -n "$(IFS=,; echo "$*")" -o %t 2>/dev/null | sort -u | tr '\n' ' ')
    [[ $state =~ ^((idle|mix|alloc)\ )+$ ]] && return 0   # not idle* (not responding) or the like
    sleep 0.2
  done
  echo "slurm-nodes: nodes $* not ready (state '${state:-?}'); see $dir/*.log" >&2
  return 1
}

# Names and ports are fixed, so one emulated cluster per machine: this file holds its DIR.
readonly owner_file=/run/pipetrain-slurm-nodes.dir
other_cluster() {  # the DIR of a live cluster other than this one, if any
  local other
  other=$(cat "$owner_file" 2>/dev/null) || return 1
  [ "$other" != "$dir" ] && alive "$other/slurmctld.pid" && echo "$other"
}

# Removes every namespace, link and daemon of the emulated cluster, whatever state it is in.
teardown() {
  local ns pid link
  for _ in $(seq 1 50); do  # again and again: a dying step may still fork
    local left=""
    for ns in $(ip netns list | awk '{print $1}' | grep "^$prefix-" || true); do
      for pid in $(ip netns pids "$ns" 2>/dev/null || true); do kill -9 "$pid" 2>/dev/null || true; left=1; done
    done
    [ -z "$left" ] && break
    sleep 0.1
  done
  if alive "$dir/slurmctld.pid"; then
    pid=$(cat "$dir/slurmctld.pid"); kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  for daemon in slurmdbd mariadb; do
    if alive "$dir/$daemon.pid"; then
      pid=$(cat "$dir/$daemon.pid"); kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$dir/$daemon.pid"
  done
  rm -f "$dir/slurmctld.pid" "$dir"/slurmd.*.pid "$owner_file"
  for cg in "$(cg_root)/$prefix"-*; do [ -d "$cg" ] && rmdir "$cg" 2>/dev/null; done || true
  for ns in $(ip netns list | awk '{print $1}' | grep "^$prefix-" || true); do
    ip netns del "$ns" 2>/dev/null || echo "slurm-nodes: could not remove namespace $ns" >&2
  done
  for link in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^$prefix-" || true); do
    ip link del "$link" 2>/dev/null || true
  done
}

case "$cmd" in
up)
  n=${3:-}; cpus=${4:-4}; accounting=${5:-}
  [[ $n =~ ^[1-9][0-9]?$ ]] || { echo "slurm-nodes: up needs a node count 1..99, got '${n}'" >&2; exit 2; }
  [ -z "$accounting" ] || [ "$accounting" = accounting ] ||
    { echo "slurm-nodes: up takes 'accounting' after CPUS, got '$accounting'" >&2; exit 2; }
  if alive "$dir/slurmctld.pid"; then echo "slurm-nodes: already up ($dir); run down first" >&2; exit 1; fi
  if other=$(other_cluster); then echo "slurm-nodes: another emulated cluster is up ($other); run down on it first" >&2; exit 1; fi
  teardown   # leftovers of an earlier run that died
  echo "$dir" > "$owner_file"
  trap 'echo "slurm-nodes: up failed; removing what it made" >&2; teardown' ERR
  mkdir -p "$dir/state" "$dir/spool"
  ip link add "$bridge" type bridge
  ip addr add "$subnet.1/24" dev "$bridge"
  ip link set "$bridge" up
  nodes=()
  for i in $(seq 1 "$n"); do
    node=node$i; ns=$(netns_of "$node"); veth=$(veth_of "$node")
    ip netns add "$ns"
    ip link add "$veth" type veth peer name eth0 netns "$ns"
    ip link set "$veth" master "$bridge" up
    ip -n "$ns" addr add "$subnet.$((10 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    nodes+=("NodeName=$node NodeAddr=$subnet.$((10 + i)) CPUs=$cpus State=UNKNOWN")
  done
  cat > "$conf" <<CONF
# written by scripts/cluster/slurm-nodes.sh: $n emulated nodes (network namespaces) without munge or systemd
ClusterName=pipetrain-nodes
SlurmctldHost=localhost($subnet.1)
SlurmctldPort=$ctl_port
SlurmdPort=$node_port
$(if [ -n "$accounting" ]; then
    grep -v '^AccountingStorageType=' "$(dirname "$0")/slurm-base.conf"
    printf 'AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\nAccountingStoragePort=%s\n' $dbd_port
  else cat "$(dirname "$0")/slurm-base.conf"; fi)
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.%n.log
$(printf '%s\n' "${nodes[@]}")
PartitionName=nodes Nodes=node[1-$n] Default=YES MaxTime=INFINITE State=UP
CONF
  [ -z "$accounting" ] || start_accounting
  slurmctld -f "$conf" -i -c
  for i in $(seq 1 "$n"); do start_slurmd "node$i"; done
  wait_idle $(seq -f 'node%g' 1 "$n")
  trap - ERR
  echo "slurm-nodes: up, $n nodes ($dir); export SLURM_CONF=$conf" ;;
down)
  if other=$(other_cluster); then echo "slurm-nodes: the emulated cluster that is up is $other's, not $dir's" >&2; exit 1; fi
  teardown
  echo "slurm-nodes: down ($dir)" ;;
status)
  if alive "$dir/slurmctld.pid"; then echo "slurmctld: running (pid $(cat "$dir/slurmctld.pid"))"; else echo "slurmctld: stopped"; fi
  for ns in $(ip netns list | awk '{print $1}' | grep "^$prefix-" | sort -V || true); do
    node=${ns#"$prefix-"}
    link=$(ip -o link show "$(veth_of "$node")" 2>/dev/null | grep -q 'state UP' && echo up || echo down)
    if alive "$dir/slurmd.$node.pid"; then d="slurmd pid $(cat "$dir/slurmd.$node.pid")"; else d="slurmd stopped"; fi
    echo "$node: $(ip -n "$ns" -4 -o addr show eth0 | awk '{print $4}'), link $link, $d"
  done
  alive "$dir/slurmctld.pid" && sinfo -N || true ;;
crash)
  node=${3:-}; need_node "$node"
  ip link set "$(veth_of "$node")" down   # no FIN or RST reaches the peers: the node just goes silent
  for pid in $(ip netns pids "$(netns_of "$node")"); do kill -9 "$pid" 2>/dev/null || true; done
  rm -f "$dir/slurmd.$node.pid"
  echo "slurm-nodes: $node crashed at $(date +%s.%N)" ;;
revive)
  node=${3:-}; need_node "$node"
  ip link set "$(veth_of "$node")" up
  alive "$dir/slurmd.$node.pid" || start_slurmd "$node"
  scontrol update nodename="$node" state=resume 2>/dev/null || true   # a DOWN node else waits ~2.5 min
  wait_idle "$node"
  echo "slurm-nodes: $node revived" ;;
link-down|link-up)
  node=${3:-}; need_node "$node"
  ip link set "$(veth_of "$node")" "${cmd#link-}"
  echo "slurm-nodes: $node link ${cmd#link-} at $(date +%s.%N)" ;;
slow)
  node=${3:-}; rate=${4:-}; need_node "$node"
  if [ "$rate" = off ]; then
    ip netns exec "$(netns_of "$node")" tc qdisc del dev eth0 root 2>/dev/null || true
    echo "slurm-nodes: $node sends at full speed"; exit 0
  fi
  [[ $rate =~ ^[0-9]+[kmg]?bit$ ]] || { echo "slurm-nodes: slow needs a rate like 20mbit or off, got '$rate'" >&2; exit 2; }
  ip netns exec "$(netns_of "$node")" tc qdisc replace dev eth0 root tbf rate "$rate" burst 64kb latency 2s
  echo "slurm-nodes: $node sends at most $rate" ;;
throttle)
  node=${3:-}; pct=${4:-}; need_node "$node"
  uncap "$node"
  if [ "$pct" = off ]; then echo "slurm-nodes: $node runs uncapped"; exit 0; fi
  [[ $pct =~ ^[1-9][0-9]*$ ]] || { echo "slurm-nodes: throttle needs a percentage of one CPU like 50, or off, got '$pct'" >&2; exit 2; }
  cg=$(cg_of "$node")
  mkdir "$cg"
  # A short period (5 ms) spreads the cap over every millisecond-long kernel, as a slower clock
  # would, rather than stopping the node for 60 ms of every 100 ms.
  if [ "$(cg_root)" = /sys/fs/cgroup ]; then
    echo +cpu > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    echo "$((pct * 50)) 5000" > "$cg/cpu.max"
  else
    echo 5000 > "$cg/cpu.cfs_period_us"
    echo "$((pct * 50))" > "$cg/cpu.cfs_quota_us"
  fi
  for pid in $(ip netns pids "$(netns_of "$node")"); do echo "$pid" > "$cg/cgroup.procs" 2>/dev/null || true; done
  echo "slurm-nodes: $node capped at $pct% of one CPU" ;;
pin)
  node=${3:-}; cpus=${4:-}; need_node "$node"
  [[ $cpus =~ ^[0-9]+([-,][0-9]+)*$ ]] || { echo "slurm-nodes: pin needs host CPUs like 1 or 0-3, got '$cpus'" >&2; exit 2; }
  for pid in $(ip netns pids "$(netns_of "$node")"); do taskset -a -p -c "$cpus" "$pid" > /dev/null; done
  echo "slurm-nodes: $node runs on CPUs $cpus" ;;
exec)
  node=${3:-}; need_node "$node"; shift 3
  pid=$(cat "$dir/slurmd.$node.pid")   # join slurmd's namespaces: what its job steps see
  exec nsenter -t "$pid" -n -i -u -m -- "$@" ;;
*) echo "slurm-nodes: unknown command '$cmd'" >&2; sed -n '2,22p' "$0" >&2; exit 2 ;;
esac
