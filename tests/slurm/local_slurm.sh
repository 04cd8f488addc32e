#!/usr/bin/env bash
# A real SLURM cluster of two nodes (node01, node02) on this host, for the tests and CI:
#   tests/slurm/local_slurm.sh start|stop|status
# start installs Debian's slurmctld, slurmd, slurm-client and munge when they are missing, starts
# munged (unless one answers already), one slurmctld and one slurmd per node (multiple-slurmd, a
# port each), and waits until both nodes are idle. Clients reach it through the SLURM_CONF line it
# prints. Everything lives in a folder of its own ($MPSLAUNCH_SLURM_DIR, /tmp/mpslaunch-slurm by
# default); the node names resolve to 127.0.0.1 through /etc/hosts lines it adds and removes.
# stop ends the jobs, then only the processes this script started (they carry a marker in their
# environment; a munged it found running is left alone), and removes the /etc/hosts lines. start
# and stop need root, Linux and apt-get (or the packages installed); status needs none of them.
set -euo pipefail

STATE=${MPSLAUNCH_SLURM_DIR:-/tmp/mpslaunch-slurm}
CONF=$STATE/slurm.conf
NODES=(node01 node02)
CONTROLLER_PORT=${MPSLAUNCH_SLURM_PORT:-6817}  # the nodes listen on the next ports
HOSTS_MARK="# mpslaunch local slurm: $STATE"
KILL_WAIT=5  # seconds between SIGTERM and SIGKILL of a cancelled job (SLURM's default is 30)
export SLURM_CONF=$CONF PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

say() { echo "local_slurm: $*"; }
now() { date +%s%N; }
since() { local ns=$(( $(now) - $1 )); printf '%d.%d' $((ns / 1000000000)) $((ns / 100000000 % 10)); }
fail() { echo "local_slurm: error: $*" >&2; exit 1; }

# Every process this script started for this cluster, and theirs (slurmstepd, slurmscriptd):
# they carry the cluster's marker in their environment, which no other process has.
marked_pids() {
    grep -lzxF "MPSLAUNCH_LOCAL_SLURM=$STATE" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 || true
}

# The munged this script started (a marked one), if it is alive.
own_munged() {
    local pid
    pid=$(cat "$STATE/munged.pid" 2>/dev/null) && marked_pids | grep -qx "$pid" && echo "$pid"
}

# The marked processes but munged, which outlives them so that their last messages authenticate.
slurm_pids() { marked_pids | grep -vx "$(own_munged || echo none)" || true; }

# One line per node: its state as sinfo writes it (idle, mix, alloc; `*` when not responding).
answers() { timeout 5 sinfo -h -N -o '%t' 2>/dev/null; }

nodes_in() { [ "$(answers | grep -cxE "$1")" = "${#NODES[@]}" ]; }
nodes_idle() { nodes_in idle; }
running() { [ -f "$CONF" ] && daemons_alive && nodes_in 'idle|mix|alloc|comp'; }

# Each daemon's pid file names a live process started with this cluster's config (readable
# without root, unlike the environments).
daemons_alive() {
    local name pid
    for name in slurmctld "${NODES[@]/#/slurmd-}"; do
        pid=$(cat "$STATE/$name.pid" 2>/dev/null) && [[ $pid =~ ^[0-9]+$ ]] || return 1
        tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "-f $CONF" || return 1
    done
}

need_root_and_packages() {
    [ "$(uname -s)" = Linux ] || fail "a local SLURM runs on Linux only"
    [ "$(id -u)" = 0 ] || fail "starting SLURM needs root (it writes /etc/hosts and runs the daemons)"
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v srun >/dev/null \
        && command -v munged >/dev/null && return
    command -v apt-get >/dev/null || fail "SLURM is not installed and there is no apt-get to install it"
    say "installing slurmctld slurmd slurm-client munge (apt-get)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        slurmctld slurmd slurm-client munge) >"${TMPDIR:-/tmp}/local_slurm_apt.log" 2>&1 \
        || fail "apt-get could not install SLURM (see ${TMPDIR:-/tmp}/local_slurm_apt.log)"
}

ports_free() {
    local port
    for port in $(seq "$CONTROLLER_PORT" $((CONTROLLER_PORT + ${#NODES[@]}))); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            fail "port $port is in use; MPSLAUNCH_SLURM_PORT=N picks N and the ports after it"
        fi
    done
}

munge_answers() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    if munge_answers; then return; fi  # someone else's munged: used, never stopped
    mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
    rm -f /run/munge/munged.pid
    daemon runuser -u munge -- munged || fail "munged did not start"
    wait_until 10 munge_answers || fail "munged does not answer"
    cp /run/munge/munged.pid "$STATE/munged.pid"
}

wait_until() {  # wait_until SECONDS COMMAND...: true once COMMAND succeeds
    local deadline=$((SECONDS + $1)); shift
    until "$@"; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.1
    done
}

write_config() {
    local cpus node port=$CONTROLLER_PORT
    cpus=$(nproc); [ "$cpus" -ge 4 ] || cpus=4  # room for 2 tasks per node and a second job
    cat >"$CONF" <<EOF
ClusterName=mpslaunch
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CONTROLLER_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=$KILL_WAIT
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd-%n.log
PlugStackConfig=$STATE/plugstack.conf
EOF
    for node in "${NODES[@]}"; do
        port=$((port + 1))
        echo "NodeName=$node NodeHostname=$(hostname) NodeAddr=127.0.0.1 Port=$port CPUs=$cpus State=UNKNOWN" >>"$CONF"
    done
    echo "PartitionName=local Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP" >>"$CONF"
    : >"$STATE/plugstack.conf"
}

hosts_without_ours() { grep -vF -- "$HOSTS_MARK" /etc/hosts || true; }

add_hosts() {
    local kept
    kept=$(hosts_without_ours)
    # Written in place: /etc/hosts is often a bind mount that cannot be replaced by a rename.
    printf '%s\n%s\n' "$kept" "127.0.0.1 ${NODES[*]} $HOSTS_MARK" >/etc/hosts
}

remove_hosts() {
    grep -qF -- "$HOSTS_MARK" /etc/hosts 2>/dev/null || return 0
    local kept
    kept=$(hosts_without_ours)
    printf '%s\n' "$kept" >/etc/hosts
}

# A daemon in a clean environment (nothing of the caller's, such as a test's TMPDIR), from /.
# The lock's descriptor (9) stays here, or the daemons would hold the lock for as long as they run.
daemon() { (cd / && env -i PATH="$PATH" MPSLAUNCH_LOCAL_SLURM="$STATE" "$@" 9>&-); }

start() {
    if running; then
        say "already running; export SLURM_CONF=$CONF"
        return
    fi
    need_root_and_packages
    [ -z "$(marked_pids)" ] || stop_quietly  # what a killed earlier run left
    local started node
    started=$(now)
    rm -rf "$STATE/ctld" "$STATE/spool" "$STATE"/*.pid "$STATE"/*.log
    mkdir -p "$STATE/ctld" && chmod 755 "$STATE"
    for node in "${NODES[@]}"; do mkdir -p "$STATE/spool/$node"; done
    ports_free
    write_config
    add_hosts
    start_munge
    daemon slurmctld -c -f "$CONF" || fail "slurmctld did not start (see $STATE/slurmctld.log)"
    for node in "${NODES[@]}"; do
        daemon slurmd -c -f "$CONF" -N "$node" || fail "slurmd $node did not start (see $STATE/slurmd-$node.log)"
    done
    if ! wait_until 60 nodes_idle; then
        tail -n 5 "$STATE/slurmctld.log" >&2 || true
        fail "the nodes are not idle after 60 s ($(answers | tr '\n' ' ')); see $STATE/*.log"
    fi
    say "started in $(since "$started") s; export SLURM_CONF=$CONF"
}

# Ends the jobs first (their processes get SIGTERM, then SIGKILL after KillWait), then the
# daemons this script started; what outlives a SIGTERM for 15 s is killed; munged last.
stop_quietly() {
    local jobs munged
    if [ -n "$(slurm_pids)" ] && jobs=$(timeout 5 squeue -h -o %A 2>/dev/null) && [ -n "$jobs" ]; then
        timeout 5 scancel $jobs 2>/dev/null || true
        wait_until $((KILL_WAIT + 5)) no_jobs || true
    fi
    signal TERM "$(slurm_pids)"
    wait_until 15 no_slurm_left || signal KILL "$(slurm_pids)"
    if munged=$(own_munged); then
        signal TERM "$munged"
        wait_until 5 no_marked_left || signal KILL "$(marked_pids)"
    fi
    rm -f "$STATE/munged.pid"
    remove_hosts
}

signal() { [ -z "$2" ] || kill -"$1" $2 2>/dev/null || true; }
no_jobs() { [ -z "$(timeout 5 squeue -h -o %A 2>/dev/null)" ]; }
no_slurm_left() { [ -z "$(slurm_pids)" ]; }
no_marked_left() { [ -z "$(marked_pids)" ]; }

stop() {
    if [ -z "$(marked_pids)" ] && ! grep -qF -- "$HOSTS_MARK" /etc/hosts 2>/dev/null; then
        say "not running"
        return
    fi
    [ "$(id -u)" = 0 ] || fail "stopping SLURM needs root"
    local started
    started=$(now)
    stop_quietly
    say "stopped in $(since "$started") s"
}

status() {
    if running; then
        say "running; export SLURM_CONF=$CONF"
    else
        say "not running"
        return 1
    fi
}

# One start or stop at a time: a second waits, then finds the cluster running (or stopped).
one_at_a_time() {
    exec 9>"$STATE.lock"
    flock -w 120 9 || fail "another start or stop of $STATE holds $STATE.lock"
}

case "${1:-}" in
    start) one_at_a_time; start ;;
    stop) one_at_a_time; stop ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
