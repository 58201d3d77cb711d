#!/usr/bin/env bash
# A real one-node SLURM cluster on localhost, without systemd, for the suite's tests and for
# trying the SLURM launcher on a laptop:
#
#   launch/cluster/local_slurm.sh start     # munged, mariadbd, slurmdbd, slurmctld, slurmd (as root)
#   export SLURM_CONF=$(launch/cluster/local_slurm.sh conf)
#   python -m src.run -m experiment=smoke/digits hydra/launcher=slurm
#   launch/cluster/local_slurm.sh stop      # stops only the daemons this script started (PID files)
#
# SLURM_LOCAL_NODES=2 starts two nodes instead of one, for multi-node jobs: several slurmd on one
# address need a build with --enable-multiple-slurmd (per-node ports), which this script does not
# assume of Debian's (not tried), so each node is a network namespace made here (ca-n1, ca-n2: a
# veth pair each, 10.211.<i>.2 inside, 10.211.<i>.1 on the host, the host forwarding between
# them), its own slurmd inside, its name in /etc/hosts (the lines marked "local_slurm", removed by
# stop). Both nodes share the host's CPUs
# and files; the controller answers at 10.211.1.1. The host's name resolves to 127.0.0.1 inside
# every node, so a multi-node job names its interface: export GLOO_SOCKET_IFNAME=ca0 (each node's
# link is called ca0; on a real cluster the host name resolves to the node's own address).
#
# Needs Debian's slurmctld, slurmd, slurm-client, munge, slurmdbd, mariadb-server (and iproute2 for two nodes)
# (`launch/cluster/local_slurm.sh install` installs them with apt). Everything it writes lives under
# $SLURM_LOCAL_DIR (default /tmp/conditioned-attention-slurm), except /run/munge, the
# socket path slurm's munge plugin expects. Pitfalls it handles, as measured on this kind of
# machine: SlurmctldHost must be `hostname -s` with NodeAddr=127.0.0.1; DefMemPerCPU, or
# jobs run one at a time; AuthInfo=cred_expire=10, or a requeued job waits two minutes; the
# node's sockets/cores come from `slurmd -C`; no cgroups (proctrack/linuxproc, task/none).
set -euo pipefail

STATE=${SLURM_LOCAL_DIR:-/tmp/conditioned-attention-slurm}
NODES=${SLURM_LOCAL_NODES:-1}
[[ $NODES == 1 || $NODES == 2 ]] || { echo "[local_slurm] SLURM_LOCAL_NODES=$NODES: 1 or 2" >&2; exit 2; }
HOSTS_MARK="# local_slurm (conditioned-attention)"
CONF=$STATE/etc/slurm.conf
DB_PORT=${SLURM_LOCAL_DB_PORT:-3317}
HOST=$(hostname -s)
DAEMONS=(slurmd slurmctld slurmdbd mariadbd munged)   # stop order

log() { printf '[local_slurm] %s\n' "$*" >&2; }

running() {  # running NAME: the PID file names a live process
  local pidfile=$STATE/run/$1.pid
  [[ -s $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND…
  local limit=$1 what=$2; shift 2
  for _ in $(seq $((limit * 10))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  log "timed out after ${limit}s waiting for $what; logs in $STATE/log"; return 1
}

install_packages() {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    slurmctld slurmd slurm-client munge slurmdbd mariadb-server iproute2 >/dev/null  # iproute2: two nodes
}

write_configs() {
  mkdir -p "$STATE"/{etc,log,run,spool/ctld,spool/d,mysql}
  # CPUs, boards, sockets, cores and memory as slurmd sees them
  local node; node=$(slurmd -C | head -n 1 | sed "s/^NodeName=[^ ]*/NodeName=$HOST NodeAddr=127.0.0.1/")
  local mem; mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
  local cpus; cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$node")
  local ctld=$HOST slurmd_files nodes=$node
  slurmd_files="SlurmdSpoolDir=$STATE/spool/d
SlurmdPidFile=$STATE/run/slurmd.pid
SlurmdLogFile=$STATE/log/slurmd.log"
  if [[ $NODES == 2 ]]; then  # two namespaces, each a node with half the memory
    ctld="$HOST(10.211.1.1)"
    slurmd_files="SlurmdSpoolDir=$STATE/spool/d-%n
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmdLogFile=$STATE/log/slurmd-%n.log"
    nodes=""
    for i in 1 2; do
      nodes+=$(sed -e "s/^NodeName=$HOST NodeAddr=127.0.0.1/NodeName=ca-n$i NodeAddr=10.211.$i.2/" \
        -e "s/RealMemory=[0-9]*/RealMemory=$((mem / 2))/" <<<"$node")$'\n'
    done
  fi
  cat >"$CONF" <<CONF
ClusterName=local
SlurmctldHost=$ctld
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$((mem / cpus / 2 / NODES))
ReturnToService=2
JobRequeue=1
StateSaveLocation=$STATE/spool/ctld
$slurmd_files
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmctldParameters=enable_configless
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
InactiveLimit=0
KillWait=5
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
Waittime=0
$(sed '/^$/d; s/$/ State=UNKNOWN/' <<<"$nodes")
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  cat >"$STATE/etc/slurmdbd.conf" <<CONF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$STATE/run/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
CONF
  chmod 600 "$STATE/etc/slurmdbd.conf"
}

start_munge() {
  running munged && return 0
  mkdir -p /run/munge && chmod 755 /run/munge
  [[ -s /etc/munge/munge.key ]] || { mkdir -p /etc/munge; dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null; chmod 400 /etc/munge/munge.key; }
  munged --force --pid-file="$STATE/run/munged.pid" --log-file="$STATE/log/munged.log" \
    --seed-file="$STATE/run/munged.seed"
  wait_for 10 munged munge -n
}

start_mariadb() {
  running mariadbd && return 0
  if [[ ! -d $STATE/mysql/mysql ]]; then
    mariadb-install-db --user=root --datadir="$STATE/mysql" --auth-root-authentication-method=socket \
      >"$STATE/log/mariadb-install.log" 2>&1
  fi
  mariadbd --user=root --datadir="$STATE/mysql" --socket="$STATE/run/mysql.sock" --port="$DB_PORT" \
    --bind-address=127.0.0.1 --pid-file="$STATE/run/mariadbd.pid" --log-error="$STATE/log/mariadb.log" \
    --innodb-buffer-pool-size=32M --skip-log-bin >/dev/null 2>&1 &
  wait_for 30 mariadbd mariadb --socket="$STATE/run/mysql.sock" -e "select 1"
  mariadb --socket="$STATE/run/mysql.sock" -e "
    create user if not exists 'slurm'@'localhost' identified by 'slurm';
    create user if not exists 'slurm'@'127.0.0.1' identified by 'slurm';
    grant all on slurm_acct_db.* to 'slurm'@'localhost';
    grant all on slurm_acct_db.* to 'slurm'@'127.0.0.1';"
}

start_slurm() {
  export SLURM_CONF=$CONF
  if ! running slurmdbd; then
    SLURM_CONF=$CONF slurmdbd
    wait_for 30 slurmdbd sacctmgr -n list cluster
  fi
  sacctmgr -i -Q add cluster local >/dev/null 2>&1 || true
  running slurmctld || slurmctld -f "$CONF"
  wait_for 30 slurmctld scontrol ping
  if [[ $NODES == 1 ]]; then
    running slurmd || slurmd -f "$CONF"
    wait_for 30 "node $HOST" bash -c "sinfo -h -n $HOST -o %t | grep -qE '^(idle|mix|alloc)'"
    return
  fi
  for i in 1 2; do
    running "slurmd-ca-n$i" || nsenter --net="/run/netns/ca-n$i" slurmd -f "$CONF" -N "ca-n$i"  # ip netns exec would remount /sys, hiding the cgroup fs slurmd reads
  done
  wait_for 60 "nodes ca-n1 and ca-n2" bash -c "[[ \$(sinfo -h -N -o %t | grep -cE '^(idle|mix|alloc)') == 2 ]]"
}

start_namespaces() {  # two network namespaces, each a node reachable from the host and the other
  sysctl -q -w net.ipv4.ip_forward=1
  for i in 1 2; do
    if ! ip netns list | grep -q "^ca-n$i\b"; then
      ip netns add "ca-n$i"
      ip link add "ca-h$i" type veth peer name "ca-v$i"
      ip link set "ca-v$i" netns "ca-n$i"
      ip addr add "10.211.$i.1/24" dev "ca-h$i"
      ip link set "ca-h$i" up
      ip netns exec "ca-n$i" ip link set "ca-v$i" name ca0  # one name on every node: GLOO_SOCKET_IFNAME=ca0
      ip netns exec "ca-n$i" ip addr add "10.211.$i.2/24" dev ca0
      ip netns exec "ca-n$i" ip link set ca0 up
      ip netns exec "ca-n$i" ip link set lo up
      ip netns exec "ca-n$i" ip route add default via "10.211.$i.1"
    fi
    grep -q "ca-n$i $HOSTS_MARK" /etc/hosts || echo "10.211.$i.2 ca-n$i $HOSTS_MARK" >>/etc/hosts
  done
}

stop_namespaces() {
  command -v ip >/dev/null || return 0  # no iproute2: no namespace was made here
  for i in 1 2; do
    ip netns list | grep -q "^ca-n$i\b" || continue
    ip netns pids "ca-n$i" | xargs -r kill 2>/dev/null || true  # a job's steps left on the node
    ip netns del "ca-n$i" && log "removed namespace ca-n$i"
  done
  # a namespace's deletion takes its veth pair with it (racing a check here): this only clears a
  # pair a failed start left behind
  for i in 1 2; do ip link del "ca-h$i" 2>/dev/null || true; done
  sed -i "/$HOSTS_MARK/d" /etc/hosts
}

case ${1:-} in
  install) install_packages ;;
  start)
    command -v slurmctld >/dev/null || { log "slurm is not installed: run '$0 install' (apt, as root)"; exit 2; }
    [[ $(id -u) == 0 ]] || { log "run as root: the daemons are started as root"; exit 2; }
    write_configs
    [[ $NODES == 1 ]] || start_namespaces
    start_munge
    start_mariadb
    start_slurm
    log "up: export SLURM_CONF=$CONF"
    ;;
  stop)  # whatever of either mode is running
    for d in slurmd-ca-n1 slurmd-ca-n2 "${DAEMONS[@]}"; do
      if running "$d"; then kill "$(cat "$STATE/run/$d.pid")" && log "stopped $d"; fi
    done
    stop_namespaces
    ;;
  status)
    for d in "${DAEMONS[@]}"; do running "$d" && echo "$d running" || echo "$d stopped"; done
    for d in slurmd-ca-n1 slurmd-ca-n2; do running "$d" && echo "$d running"; done; true ;;
  conf) echo "$CONF" ;;
  *) echo "usage: $0 install|start|stop|status|conf" >&2; exit 2 ;;
esac
