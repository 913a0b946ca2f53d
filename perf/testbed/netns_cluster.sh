#!/usr/bin/env bash
# netns_cluster.sh -- emulate an N-host, bandwidth-limited cluster on one machine
# using network namespaces, veth pairs, a Linux bridge and tbf shaping, then run
# a command (typically mpirun) inside host namespace h0.
#
# Usage:
#   netns_cluster.sh [--hosts N] [--rate 1gbit|none] [--prefix P] [--slots K]
#                    [--burst 256kb] [--latency 50ms] [--no-uts]
#                    [--switch-ip] [--agg-hosts M]
#                    -- <command ...>
#
# Topology (all links live only inside namespaces created here; nothing is
# created in, or routed through, the root network namespace):
#
#   <P>-h0 [eth0 10.77.0.1/24] ==veth== [vh0]--+
#   <P>-h1 [eth0 10.77.0.2/24] ==veth== [vh1]--+-- br0   (in namespace <P>-br)
#   ...                                        |
#
# With --rate R (not "none") a tbf qdisc (rate R) is attached to BOTH ends of
# every host link: host-side eth0 egress (host -> bridge) and bridge-side vhI
# egress (bridge -> host).  A flow hI -> hJ is therefore limited to R.
#
# --switch-ip gives the bridge itself an address, 10.77.0.254, in namespace <P>-br: a process
# there (an aggregator) sits where a switch would, behind every host's shaped port.
# --agg-hosts M adds M more hosts <P>-a0.. (10.77.0.101..) with the same shaped links, outside
# the MPI host list: places for aggregators on hosts of their own.
#
# The command runs inside <P>-h0 with these variables exported:
#   THC_TESTBED_HOSTS        comma-separated host IPs (10.77.0.1,10.77.0.2,...)
#   THC_TESTBED_MPIRUN_ARGS  extra mpirun arguments that span the namespaces
#   THC_TESTBED_RATE         the --rate value ("none" when unshaped)
#   THC_TESTBED_PREFIX       the namespace prefix
#   THC_TESTBED_NHOSTS       N
#   THC_TESTBED_AGENT        path of the generated rsh agent
#   THC_TESTBED_SWITCH_IP    10.77.0.254 with --switch-ip (namespace: THC_TESTBED_BRIDGE_NS)
#   THC_TESTBED_BRIDGE_NS    the bridge namespace
#   THC_TESTBED_AGG_HOSTS    comma-separated aggregator host IPs (--agg-hosts)
#   THC_TESTBED_AGG_NS       comma-separated aggregator host namespaces
# plus OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 when run as root.
#
# Example:
#   perf/testbed/netns_cluster.sh --hosts 4 --rate 1gbit -- \
#     sh -c 'mpirun -np 4 $THC_TESTBED_MPIRUN_ARGS hostname'
#
# Everything (namespaces, veths, bridge, qdiscs, temp dir, processes left in
# the namespaces) is torn down on exit, including on failure, Ctrl-C or TERM.
# The exit status is the command's exit status (setup failures: non-zero;
# 2 = bad usage, 101 = a link did not come up, 130/143 = INT/TERM).

set -euo pipefail

usage() {
  sed -n '2,/^$/{s/^# \{0,1\}//;p}' "$0" >&2
  exit 2
}

NHOSTS=4
RATE=1gbit
PREFIX="thcnet-$$"
SLOTS=1
BURST=256kb
LATENCY=50ms
SET_UTS=1
SWITCH_IP=0
NAGG=0
SUBNET_BASE=10.77.0
SUBNET="${SUBNET_BASE}.0/24"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --hosts)   NHOSTS="$2"; shift 2 ;;
    --rate)    RATE="$2"; shift 2 ;;
    --prefix)  PREFIX="$2"; shift 2 ;;
    --slots)   SLOTS="$2"; shift 2 ;;
    --burst)   BURST="$2"; shift 2 ;;
    --latency) LATENCY="$2"; shift 2 ;;
    --no-uts)  SET_UTS=0; shift ;;
    --switch-ip) SWITCH_IP=1; shift ;;
    --agg-hosts) NAGG="$2"; shift 2 ;;
    -h|--help) usage ;;
    --)        shift; break ;;
    *) echo "netns_cluster: unknown argument '$1' (missing '--' before the command?)" >&2; usage ;;
  esac
done
[[ $# -gt 0 ]] || { echo "netns_cluster: no command given after --" >&2; usage; }
[[ "$NHOSTS" =~ ^[0-9]+$ ]] && (( NHOSTS >= 1 && NHOSTS <= 200 )) \
  || { echo "netns_cluster: --hosts must be 1..200" >&2; exit 2; }
[[ "$NAGG" =~ ^[0-9]+$ ]] && (( NAGG <= 50 )) \
  || { echo "netns_cluster: --agg-hosts must be 0..50" >&2; exit 2; }
[[ "$SLOTS" =~ ^[0-9]+$ ]] && (( SLOTS >= 1 )) \
  || { echo "netns_cluster: --slots must be >= 1" >&2; exit 2; }
# The prefix becomes part of netns names and is matched when cleaning up.
[[ "$PREFIX" =~ ^[A-Za-z0-9_.-]{1,40}$ ]] \
  || { echo "netns_cluster: --prefix must match [A-Za-z0-9_.-]{1,40}" >&2; exit 2; }
if [[ $(id -u) -ne 0 ]]; then
  echo "netns_cluster: must run as root (creates network namespaces)" >&2; exit 2
fi
for tool in ip tc mpirun; do
  command -v "$tool" >/dev/null || { echo "netns_cluster: '$tool' not found" >&2; exit 2; }
done

BRNS="${PREFIX}-br"
hostns() { echo "${PREFIX}-h$1"; }
hostip() { echo "${SUBNET_BASE}.$(( $1 + 1 ))"; }
aggns() { echo "${PREFIX}-a$1"; }
aggip() { echo "${SUBNET_BASE}.$(( $1 + 101 ))"; }

log() { echo "[netns_cluster:$PREFIX] $*" >&2; }
TMPD=""

# ---------------------------------------------------------------- teardown --
# Kill whatever still runs inside one of OUR namespaces (by pid), then delete
# the namespace.  Deleting a namespace destroys the veth ends inside it (and
# thereby their peers), the bridge and qdiscs.
kill_ns_pids() {
  local ns="$1" sig="$2" pids
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  [[ -n "$pids" ]] && kill "-$sig" $pids 2>/dev/null || true
}

destroy_prefix() {
  local nss ns i d
  # temp dirs of earlier runs with this prefix that died without cleanup
  # (only our own layout: /tmp/<P>.XXXXXX containing the generated agent)
  for d in /tmp/"${PREFIX}".??????; do
    [[ -d "$d" && -f "$d/rsh_agent.sh" && "$d" != "$TMPD" ]] && rm -rf -- "$d"
  done
  # exact prefix match: "<P>-br", "<P>-h<digits>" or "<P>-a<digits>"
  nss=$(ip netns list 2>/dev/null | awk '{print $1}' \
        | grep -E "^${PREFIX//./\\.}-(br|h[0-9]+|a[0-9]+)$" || true)
  [[ -z "$nss" ]] && return 0
  for ns in $nss; do kill_ns_pids "$ns" TERM; done
  for i in 1 2 3 4 5 6 7 8 9 10; do
    local alive=0
    for ns in $nss; do [[ -n "$(ip netns pids "$ns" 2>/dev/null)" ]] && alive=1; done
    (( alive )) || break
    sleep 0.2
  done
  for ns in $nss; do kill_ns_pids "$ns" KILL; done
  for ns in $nss; do ip netns delete "$ns" 2>/dev/null || true; done
}

CMD_PID=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM HUP
  set +e
  if [[ -n "$CMD_PID" ]] && kill -0 "$CMD_PID" 2>/dev/null; then
    kill -TERM "$CMD_PID" 2>/dev/null
  fi
  destroy_prefix
  [[ -n "$TMPD" && -d "$TMPD" ]] && rm -rf -- "$TMPD"
  local left
  left=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX//./\\.}-(br|h[0-9]+|a[0-9]+)$" || true)
  [[ -n "$left" ]] && log "WARNING: namespaces left behind: $left"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# ------------------------------------------------------------------- setup --
# Idempotence: remove leftovers of an earlier run that used the same prefix.
destroy_prefix

TMPD=$(mktemp -d "/tmp/${PREFIX}.XXXXXX")
chmod 755 "$TMPD"

ip netns add "$BRNS"
ip -n "$BRNS" link set lo up
ip -n "$BRNS" link add br0 type bridge
# no STP / forwarding delay: ports forward immediately
ip -n "$BRNS" link set br0 type bridge stp_state 0 forward_delay 0 2>/dev/null || true
ip -n "$BRNS" link set br0 up

HOSTS_CSV=""
HOST_SLOTS=""
for (( i = 0; i < NHOSTS; i++ )); do
  ns=$(hostns "$i"); ipaddr=$(hostip "$i")
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  # Both ends are created directly inside namespaces: the bridge port "vhI"
  # in the bridge namespace, its peer "eth0" in the host namespace.
  ip -n "$BRNS" link add "vh$i" type veth peer name eth0 netns "$ns"
  ip -n "$BRNS" link set "vh$i" master br0
  ip -n "$BRNS" link set "vh$i" up
  ip -n "$ns" addr add "${ipaddr}/24" dev eth0
  ip -n "$ns" link set eth0 up
  if [[ "$RATE" != "none" ]]; then
    ip netns exec "$ns"   tc qdisc replace dev eth0  root tbf rate "$RATE" burst "$BURST" latency "$LATENCY"
    ip netns exec "$BRNS" tc qdisc replace dev "vh$i" root tbf rate "$RATE" burst "$BURST" latency "$LATENCY"
  fi
  HOSTS_CSV+="${HOSTS_CSV:+,}${ipaddr}"
  HOST_SLOTS+="${HOST_SLOTS:+,}${ipaddr}:${SLOTS}"
  echo "$ipaddr $ns h$i" >> "$TMPD/hostmap"
done

# Aggregator hosts: like the others, but not in the MPI host list.
AGG_CSV=""
AGG_NS_CSV=""
for (( i = 0; i < NAGG; i++ )); do
  ns=$(aggns "$i"); ipaddr=$(aggip "$i")
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip -n "$BRNS" link add "va$i" type veth peer name eth0 netns "$ns"
  ip -n "$BRNS" link set "va$i" master br0
  ip -n "$BRNS" link set "va$i" up
  ip -n "$ns" addr add "${ipaddr}/24" dev eth0
  ip -n "$ns" link set eth0 up
  if [[ "$RATE" != "none" ]]; then
    ip netns exec "$ns"   tc qdisc replace dev eth0  root tbf rate "$RATE" burst "$BURST" latency "$LATENCY"
    ip netns exec "$BRNS" tc qdisc replace dev "va$i" root tbf rate "$RATE" burst "$BURST" latency "$LATENCY"
  fi
  AGG_CSV+="${AGG_CSV:+,}${ipaddr}"
  AGG_NS_CSV+="${AGG_NS_CSV:+,}${ns}"
done
# The switch position: the bridge's own address. Traffic from a host to it is shaped by the
# host's eth0, traffic from it to a host by the bridge port vhI: a process here sees every host
# through its own 1-port link, like a switch's pipeline.
if (( SWITCH_IP )); then
  ip -n "$BRNS" addr add "${SUBNET_BASE}.254/24" dev br0
fi

# Wait until every host link reports carrier (veth/bridge is usually instant;
# no ping dependency).
for (( i = 0; i < NHOSTS; i++ )); do
  ok=0
  for try in $(seq 1 50); do
    if ip -n "$(hostns "$i")" -br link show eth0 2>/dev/null | grep -qw UP \
       && ip -n "$BRNS" -br link show "vh$i" 2>/dev/null | grep -qw UP; then ok=1; break; fi
    sleep 0.1
  done
  (( ok )) || { log "link of host $(hostip "$i") did not come up"; exit 101; }
done

# rsh agent: Open MPI calls "<agent> [opts] <host> <orted command words...>".
# Map the host IP to its namespace and run the command there with sh -c.
# The environment (OMPI_ALLOW_RUN_AS_ROOT, PATH, ...) is inherited from mpirun
# because nothing goes through ssh.  With SET_UTS=1 the command also gets a
# private UTS namespace whose hostname is "<P>-hI", so `hostname` and
# MPI_Get_processor_name differ per emulated host.
AGENT="$TMPD/rsh_agent.sh"
cat > "$AGENT" <<EOF
#!/bin/sh
# generated by netns_cluster.sh (prefix $PREFIX)
MAP="$TMPD/hostmap"
SET_UTS=$SET_UTS
# skip ssh-style options that Open MPI might pass before the host name
while [ \$# -gt 0 ]; do
  case "\$1" in
    -x|-T|-q|-n|-f|-t|-tt|-A|-a) shift ;;
    -o|-l|-p|-i|-F) shift 2 ;;
    *) break ;;
  esac
done
target="\$1"; shift
target="\${target#*@}"
ns=\$(awk -v t="\$target" '\$1 == t || \$2 == t || \$3 == t { print \$2; exit }' "\$MAP")
if [ -z "\$ns" ]; then
  echo "rsh_agent: unknown host '\$target' (not part of testbed $PREFIX)" >&2
  exit 255
fi
if [ "\$SET_UTS" = 1 ]; then
  exec ip netns exec "\$ns" unshare --uts sh -c 'hostname "\$0" && exec sh -c "\$1"' "\$ns" "\$*"
else
  exec ip netns exec "\$ns" sh -c "\$*"
fi
EOF
chmod 755 "$AGENT"

MPIRUN_ARGS="--host ${HOST_SLOTS}"
MPIRUN_ARGS+=" --mca plm_rsh_agent ${AGENT}"
MPIRUN_ARGS+=" --mca plm_rsh_no_tree_spawn 1"
MPIRUN_ARGS+=" --mca pml ob1 --mca btl tcp,self"
MPIRUN_ARGS+=" --mca btl_tcp_if_include ${SUBNET} --mca oob_tcp_if_include ${SUBNET}"
MPIRUN_ARGS+=" -x THC_TESTBED_HOSTS -x THC_TESTBED_RATE"
if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  MPIRUN_ARGS+=" -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"
fi

export THC_TESTBED_HOSTS="$HOSTS_CSV"
export THC_TESTBED_MPIRUN_ARGS="$MPIRUN_ARGS"
export THC_TESTBED_RATE="$RATE"
export THC_TESTBED_PREFIX="$PREFIX"
export THC_TESTBED_NHOSTS="$NHOSTS"
export THC_TESTBED_AGENT="$AGENT"
export THC_TESTBED_BRIDGE_NS="$BRNS"
export THC_TESTBED_SWITCH_IP=""
(( SWITCH_IP )) && THC_TESTBED_SWITCH_IP="${SUBNET_BASE}.254"
export THC_TESTBED_AGG_HOSTS="$AGG_CSV"
export THC_TESTBED_AGG_NS="$AGG_NS_CSV"
# Open MPI session directories go to TMPDIR; keep them inside our temp dir so
# they are removed with it.
export TMPDIR="$TMPD"

log "hosts=$NHOSTS rate=$RATE slots/host=$SLOTS hosts=$HOSTS_CSV${AGG_CSV:+ aggregator hosts=$AGG_CSV}${THC_TESTBED_SWITCH_IP:+ switch=$THC_TESTBED_SWITCH_IP}"

# -------------------------------------------------------------------- run --
# Run in the background and wait, so that INT/TERM reach our trap at once.
# stdin is passed through explicitly (background jobs would get /dev/null).
H0=$(hostns 0)
if (( SET_UTS )); then
  ip netns exec "$H0" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$H0" "$@" <&0 &
else
  ip netns exec "$H0" "$@" <&0 &
fi
CMD_PID=$!
set +e
wait "$CMD_PID"
rc=$?
set -e
CMD_PID=""
exit "$rc"
