#!/usr/bin/env bash
# A real two-node Slurm cluster on 127.0.0.1, for testing `snakemake --profile slurm`.
#
#   tests/slurm/cluster.sh install   apt-get the Debian packages (root; about 20 s)
#   tests/slurm/cluster.sh start     start munged, mariadbd, slurmdbd, slurmctld and two slurmd
#   tests/slurm/cluster.sh env       print the exports a shell needs to use it (eval "$(... env)")
#   tests/slurm/cluster.sh status    sinfo of the running cluster
#   tests/slurm/cluster.sh stop      stop every daemon it started (by PID) and remove its state
#
# Everything lives under $SCALEREPRO_SLURM_DIR (default /tmp/scalerepro-slurm): configuration,
# database, spool, logs, PID files; no system service is used. Two things sit where a real
# cluster has them: /etc/slurm/slurm.conf is a link to this cluster's configuration (made only
# if that path is free, removed by stop), because Snakemake's Slurm job step strips SLURM_CONF
# from a rule's environment and srun inside a job falls back to the default path; and munge
# runs on its default socket with the package's key (see start). The daemons run as root
# (SlurmUser=root), which a throwaway test cluster may.
#
# Facts this relies on (Debian 12, Slurm 22.05): several slurmd on one host need distinct
# NodeName/Port and %n in their spool/PID/log paths; cgroups are unusable in a container, hence
# proctrack/linuxproc and task/none; SlurmdParameters=config_overrides lets a node declare more
# CPUs and GPUs than the host has; fake GPUs are GRES whose File= entries are symlinks to
# /dev/null (count-only or regular files drain the node); DefMemPerCPU keeps one job from taking
# a node's whole memory; sacct (the executor plugin's status check) needs slurmdbd + MariaDB.
set -euo pipefail

DIR=${SCALEREPRO_SLURM_DIR:-/tmp/scalerepro-slurm}
CLUSTER=scalerepro
PARTITION=gpu
CTLD_PORT=16817
DBD_PORT=16819
DB_PORT=13306
NODE_CPUS=8
NODE_MEM_MB=16000
GPUS_PER_NODE=4
SBIN=/usr/sbin
PACKAGES=(slurm-wlm munge slurmdbd mariadb-server)

die() {
	echo "cluster.sh: $*" >&2
	exit 1
}

install_packages() {
	local missing=()
	for binary in slurmctld slurmd slurmdbd munged mariadbd sbatch sacct; do
		command -v "$binary" >/dev/null || [[ -x $SBIN/$binary ]] || missing+=("$binary")
	done
	((${#missing[@]})) || return 0
	[[ $(id -u) == 0 ]] || die "installing ${PACKAGES[*]} needs root (apt-get)"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
}

write_config() {
	mkdir -p "$DIR"/{etc,munge,log,run,spool,state,gres,mysql,mysql-run}
	chmod 755 "$DIR"
	# Fake GPUs: each File= must be a character device the node can open; /dev/null is one.
	for n in $(seq 0 $((GPUS_PER_NODE - 1))); do ln -sfn /dev/null "$DIR/gres/fake$n"; done

	cat >"$DIR/etc/slurm.conf" <<EOF
ClusterName=$CLUSTER
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
StateSaveLocation=$DIR/state
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdSpoolDir=$DIR/spool/%n
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStorageTRES=gres/gpu
AccountingStoreFlags=job_comment
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=5
JobCompType=jobcomp/none
KillWait=10
MinJobAge=300
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=20
NodeName=node[01-02] NodeAddr=127.0.0.1 Port=[17001-17002] CPUs=$NODE_CPUS RealMemory=$NODE_MEM_MB Gres=gpu:fake:$GPUS_PER_NODE State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

	cat >"$DIR/etc/gres.conf" <<EOF
AutoDetect=off
NodeName=node[01-02] Name=gpu Type=fake File=$DIR/gres/fake[0-$((GPUS_PER_NODE - 1))]
EOF

	cat >"$DIR/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$DIR/run/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=scalerepro
StorageLoc=slurm_acct_db
EOF
	chmod 600 "$DIR/etc/slurmdbd.conf"

	chown munge:munge "$DIR/munge"
}

wait_for() { # wait_for <seconds> <what> <command...>
	local seconds=$1 what=$2
	shift 2
	for _ in $(seq $((seconds * 5))); do
		timeout 5 "$@" >/dev/null 2>&1 && return 0
		sleep 0.2
	done
	die "$what did not come up within ${seconds}s: see $DIR/log"
}

start() {
	install_packages
	[[ -f $DIR/run/slurmctld.pid ]] && kill -0 "$(cat "$DIR/run/slurmctld.pid")" 2>/dev/null && {
		echo "cluster.sh: already running ($DIR)"
		return 0
	}
	write_config
	export SLURM_CONF=$DIR/etc/slurm.conf
	if [[ -e /etc/slurm/slurm.conf || -L /etc/slurm/slurm.conf ]]; then
		[[ $(readlink /etc/slurm/slurm.conf) == "$SLURM_CONF" ]] ||
			die "/etc/slurm/slurm.conf exists (another cluster's?): move it away to use the test cluster"
	else
		mkdir -p /etc/slurm
		ln -s "$SLURM_CONF" /etc/slurm/slurm.conf
	fi

	# Munge on its default socket (Slurm's clients reach slurmdbd only through that one): a
	# munged that already answers there is used as it is, else one is started and stopped here.
	if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
		mkdir -p /run/munge && chown munge:munge /run/munge
		[[ -s /etc/munge/munge.key ]] || die "no /etc/munge/munge.key: reinstall munge (apt-get install --reinstall munge)"
		runuser -u munge -- "$SBIN/munged" --log-file="$DIR/munge/munged.log" --pid-file="$DIR/munge/munged.pid"
		cp "$DIR/munge/munged.pid" "$DIR/run/munged.pid"
	fi

	chown mysql:mysql "$DIR/mysql" "$DIR/mysql-run"
	if [[ ! -d $DIR/mysql/mysql ]]; then
		mariadb-install-db --user=mysql --datadir="$DIR/mysql" --auth-root-authentication-method=socket >"$DIR/log/mariadb-install.log" 2>&1
	fi
	setsid "$SBIN/mariadbd" --user=mysql --datadir="$DIR/mysql" --socket="$DIR/mysql-run/mysqld.sock" \
		--pid-file="$DIR/mysql-run/mariadbd.pid" --port=$DB_PORT --bind-address=127.0.0.1 \
		--log-error="$DIR/mysql-run/mariadbd.log" --skip-log-bin </dev/null >/dev/null 2>&1 &
	wait_for 30 mariadbd mariadb --socket="$DIR/mysql-run/mysqld.sock" -e "SELECT 1"
	mariadb --socket="$DIR/mysql-run/mysqld.sock" -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'scalerepro';
		GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"

	"$SBIN/slurmdbd" # reads the slurmdbd.conf beside $SLURM_CONF
	wait_for 30 slurmdbd sacctmgr -i list cluster
	sacctmgr -i add cluster "$CLUSTER" >/dev/null 2>&1 || true
	sacctmgr -i add account scalerepro Cluster="$CLUSTER" Description=tests Organization=tests >/dev/null 2>&1 || true
	sacctmgr -i add user root Account=scalerepro Cluster="$CLUSTER" >/dev/null 2>&1 || true

	"$SBIN/slurmctld" -f "$SLURM_CONF"
	wait_for 30 slurmctld scontrol ping
	for node in node01 node02; do
		mkdir -p "$DIR/spool/$node"
		"$SBIN/slurmd" -f "$SLURM_CONF" -N "$node"
	done
	wait_for 60 "two idle nodes" bash -c "[[ \$(sinfo -h -N -t idle -o %N | wc -l) == 2 ]]"
	echo "cluster.sh: 2 nodes x $GPUS_PER_NODE fake GPUs up; use it with: eval \"\$($0 env)\""
}

stop() {
	local pidfile pid
	# Compute daemons first, then the controller, the database daemon and what they depend on.
	for pidfile in "$DIR"/run/slurmd-*.pid "$DIR/run/slurmctld.pid" "$DIR/run/slurmdbd.pid" \
		"$DIR/mysql-run/mariadbd.pid" "$DIR/run/munged.pid"; do
		[[ -f $pidfile ]] || continue
		pid=$(cat "$pidfile")
		kill "$pid" 2>/dev/null || true
		for _ in $(seq 50); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.2
		done
		kill -9 "$pid" 2>/dev/null || true
		rm -f "$pidfile"
	done
	# Steps whose slurmstepd outlived slurmd (a killed test) would keep ports and files open.
	pkill -f "slurmstepd: \[" 2>/dev/null || true
	[[ $(readlink /etc/slurm/slurm.conf 2>/dev/null) == "$DIR/etc/slurm.conf" ]] && rm -f /etc/slurm/slurm.conf
	rm -rf "$DIR"
}

case ${1:-} in
install) install_packages ;;
start) start ;;
stop) stop ;;
env) echo "export SLURM_CONF=$DIR/etc/slurm.conf" ;;
status) SLURM_CONF=$DIR/etc/slurm.conf sinfo -N -o "%N %T %C %G" ;;
*) die "usage: $0 install|start|env|status|stop" ;;
esac
