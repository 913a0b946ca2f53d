# Sourced by the live tests that need two network namespaces joined by a veth pair
# (tests/switch_offload/dpdk/live_test.sh, tests/transport/switch_client/dpdk_client_live_test.sh).
#
#   TAG=thcdpdk; source veth_pair.sh; veth_pair_up    # -> $NSA $NSB $VA $VB $TMP
#
# Provides skip (exit 77: ctest SKIP_RETURN_CODE), die, stat LINE NAME, wait_pid PID SECONDS, and
# a cleanup trap that kills $AGG_PID and everything left in the namespaces, deletes them, the
# DPDK runtime files under /var/run/dpdk/$PREFIX* and $TMP. Names carry the shell's pid, so
# concurrent runs do not collide; interface names stay within 15 characters.

skip() {
  echo "SKIP: $*"
  exit 77
}
die() {
  echo "FAIL: $*"
  exit 1
}

ID=$$
NSA=${TAG}-a-$ID
NSB=${TAG}-b-$ID
VA=${TAG:0:4}a$ID
VB=${TAG:0:4}b$ID
PREFIX=${TAG}$ID
AGG_PID=
NS_MADE=0
TMP=

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$AGG_PID" ] && kill -0 "$AGG_PID" 2>/dev/null; then kill -KILL "$AGG_PID" 2>/dev/null; fi
  # Whatever is still running in our namespaces (a worker after a failure).
  for ns in "$NSA" "$NSB"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  done
  wait 2>/dev/null
  if [ "$NS_MADE" = 1 ]; then
    ip netns del "$NSA" 2>/dev/null
    ip netns del "$NSB" 2>/dev/null
  fi
  rm -rf /var/run/dpdk/"$PREFIX"* 2>/dev/null
  [ -n "$TMP" ] && rm -rf "$TMP"
  exit "$rc"
}

# Root, iproute2 and coreutils' timeout, or skip; then the namespaces, the veth pair (links up,
# no addresses, IPv6 off) and $TMP. Always cleaned up on exit.
veth_pair_up() {
  [ "$(id -u)" = 0 ] || skip "not root: the test needs network namespaces and a veth pair"
  command -v ip >/dev/null 2>&1 || skip "no 'ip' command (iproute2)"
  command -v timeout >/dev/null 2>&1 || skip "no 'timeout' command (coreutils)"
  TMP=$(mktemp -d "/tmp/${TAG}_live.XXXXXX") || die "mktemp"
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  ip netns add "$NSA" 2>"$TMP/err" || skip "ip netns add failed: $(cat "$TMP/err")"
  NS_MADE=1
  ip netns add "$NSB" 2>"$TMP/err" || skip "ip netns add failed: $(cat "$TMP/err")"
  ip link add "$VA" netns "$NSA" type veth peer name "$VB" netns "$NSB" 2>"$TMP/err" ||
    skip "cannot create a veth pair: $(cat "$TMP/err")"
  local ns
  for ns in "$NSA" "$NSB"; do
    ip -n "$ns" link set lo up || die "lo up in $ns"
    # No IPv6 chatter (router solicitations, MLD) on the link: less noise in the counters.
    ip netns exec "$ns" sh -c 'echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6' 2>/dev/null
  done
  ip -n "$NSA" link set "$VA" up || die "link up $VA"
  ip -n "$NSB" link set "$VB" up || die "link up $VB"
}

# stat LINE NAME: the value of NAME=... in a statistics line (0 when absent: zero drops are omitted).
stat() {
  local v
  v=$(printf '%s\n' "$1" | grep -o " $2=[0-9]*" | head -n 1 | cut -d= -f2)
  echo "${v:-0}"
}

# wait_pid PID SECONDS: wait for a child with a deadline (it is killed after it); its exit status
# goes to WAIT_STATUS, 124 on timeout. (Not in a $(...) subshell: only the parent can wait.)
WAIT_STATUS=
wait_pid() {
  local pid=$1 deadline=$((SECONDS + $2))
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      kill -KILL "$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
      WAIT_STATUS=124
      return
    fi
    sleep 0.1
  done
  wait "$pid"
  WAIT_STATUS=$?
}
