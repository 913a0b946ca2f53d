#!/usr/bin/env bash
# selftest.sh -- check that netns_cluster.sh really builds a working, shaped
# multi-host MPI testbed.
#
#   1. 4 hosts, --rate 1gbit: mpirun -np 4 smoke (each rank must land in a
#      different emulated host), then an MPI streaming bandwidth test
#      h0 -> h1.  Also checks that the traffic went through both tbf qdiscs
#      on the path (h0 eth0 egress and bridge port vh1 egress).
#   2. 4 hosts, --rate none: the same bandwidth test, unshaped.
#
# Fails (exit 1) if mpirun fails, if ranks do not spread over 4 hosts, if the
# shaped rate is not ~1 Gbit/s (outside 0.5..1.5 Gbit/s), if the unshaped rate
# is not clearly higher (< 1.5x shaped), or if anything is left behind.
# Exit 77 = skipped (not root / tools missing).  Takes ~10 s.
#
# Usage: perf/testbed/selftest.sh [--secs S]   (S = seconds per bandwidth run)

set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CLUSTER="$HERE/netns_cluster.sh"
SECS=2
[[ "${1:-}" == "--secs" ]] && SECS="$2"

if [[ $(id -u) -ne 0 ]]; then echo "selftest: SKIP (needs root)"; exit 77; fi
for t in ip tc mpirun mpicc unshare; do
  command -v "$t" >/dev/null || { echo "selftest: SKIP ('$t' not found)"; exit 77; }
done

PREFIX="thcst-$$"
WORK=$(mktemp -d "/tmp/${PREFIX}-work.XXXXXX")
chmod 755 "$WORK"
cleanup() { rm -rf -- "$WORK"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --------------------------------------------------- tiny MPI bandwidth test --
cat > "$WORK/bw.c" <<'EOF'
/* rank 0 streams 8 x 1 MiB Isend windows to rank 1 for `secs` seconds, then
 * waits for an ack; prints the goodput.  Ranks > 1 just idle in the barriers. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define WINDOW 8
int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) { fprintf(stderr, "need >= 2 ranks\n"); MPI_Abort(MPI_COMM_WORLD, 1); }
  double secs = argc > 1 ? atof(argv[1]) : 2.0;
  const int msg = 1 << 20;
  char *buf = malloc((size_t)msg * WINDOW);
  memset(buf, 1, (size_t)msg * WINDOW);
  MPI_Request req[WINDOW];
  for (int phase = 0; phase < 2; phase++) {          /* phase 0 = warm-up */
    double limit = phase ? secs : 0.3;
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
      double t0 = MPI_Wtime();
      long long bytes = 0;
      int go = 1;
      for (;;) {
        go = (MPI_Wtime() - t0) < limit;
        MPI_Send(&go, 1, MPI_INT, 1, 0, MPI_COMM_WORLD);
        if (!go) break;
        for (int w = 0; w < WINDOW; w++)
          MPI_Isend(buf + (size_t)w * msg, msg, MPI_CHAR, 1, 1, MPI_COMM_WORLD, &req[w]);
        MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
        bytes += (long long)msg * WINDOW;
      }
      MPI_Recv(&go, 1, MPI_INT, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      double dt = MPI_Wtime() - t0;
      if (phase)
        printf("BW_GBITS %.3f bytes=%lld secs=%.3f\n", bytes * 8.0 / dt / 1e9, bytes, dt);
    } else if (rank == 1) {
      int go;
      for (;;) {
        MPI_Recv(&go, 1, MPI_INT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (!go) break;
        for (int w = 0; w < WINDOW; w++)
          MPI_Irecv(buf + (size_t)w * msg, msg, MPI_CHAR, 0, 1, MPI_COMM_WORLD, &req[w]);
        MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
      }
      MPI_Send(&go, 1, MPI_INT, 0, 2, MPI_COMM_WORLD);
    }
  }
  free(buf);
  MPI_Finalize();
  return 0;
}
EOF
mpicc -O2 -o "$WORK/bw" "$WORK/bw.c"

# ------------------------------------------- script run inside namespace h0 --
cat > "$WORK/inner.sh" <<'EOF'
#!/bin/sh
# $1 = bw binary, $2 = seconds, $3 = "smoke" to run the hostname smoke first
set -e
if [ "$3" = smoke ]; then
  echo "== smoke: mpirun -np 4 \$THC_TESTBED_MPIRUN_ARGS (hostname + netns per rank)"
  mpirun -np 4 $THC_TESTBED_MPIRUN_ARGS \
    sh -c 'echo "SMOKE rank=$OMPI_COMM_WORLD_RANK host=$(hostname) netns=$(ip netns identify $$)"'
fi
echo "== bandwidth h0 -> h1, rate=$THC_TESTBED_RATE"
# -np 2 with one slot per host maps rank 0 -> h0, rank 1 -> h1
mpirun -np 2 $THC_TESTBED_MPIRUN_ARGS "$1" "$2"
if [ "$THC_TESTBED_RATE" != none ]; then
  # bytes that went through the two tbf qdiscs on the h0 -> h1 path
  echo "QDISC_H0_ETH0 $(tc -s qdisc show dev eth0 | awk '/Sent/ {print $2; exit}')"
  echo "QDISC_BR_VH1 $(ip netns exec "$THC_TESTBED_PREFIX-br" tc -s qdisc show dev vh1 | awk '/Sent/ {print $2; exit}')"
  ip netns exec "$THC_TESTBED_PREFIX-br" tc qdisc show dev vh1 | sed 's/^/  br vh1: /'
  tc qdisc show dev eth0 | sed 's/^/  h0 eth0: /'
fi
EOF
chmod 755 "$WORK/inner.sh"

fail=0
run_case() {  # $1 = rate, $2 = smoke|nosmoke, $3 = output file
  set +e
  "$CLUSTER" --hosts 4 --rate "$1" --prefix "${PREFIX}" -- \
    "$WORK/inner.sh" "$WORK/bw" "$SECS" "$2" 2>&1 | tee "$3"
  local rc=${PIPESTATUS[0]}
  set -e
  if (( rc != 0 )); then echo "selftest: FAIL: cluster run (rate=$1) exited $rc"; fail=1; fi
}

T0=$SECONDS
echo "### case 1: 4 hosts, --rate 1gbit"
run_case 1gbit smoke "$WORK/shaped.out"
echo "### case 2: 4 hosts, --rate none"
run_case none nosmoke "$WORK/unshaped.out"

shaped=$(awk '/^BW_GBITS/ {print $2}' "$WORK/shaped.out" | tail -1)
unshaped=$(awk '/^BW_GBITS/ {print $2}' "$WORK/unshaped.out" | tail -1)
shaped_bytes=$(sed -n 's/^BW_GBITS .* bytes=\([0-9]*\) .*/\1/p' "$WORK/shaped.out" | tail -1)
q_h0=$(awk '/^QDISC_H0_ETH0/ {print $2}' "$WORK/shaped.out")
q_vh1=$(awk '/^QDISC_BR_VH1/ {print $2}' "$WORK/shaped.out")
nhosts=$(grep '^SMOKE' "$WORK/shaped.out" | sed 's/.*netns=//' | sort -u | grep -c . || true)

echo
echo "=================== selftest summary ==================="
echo "smoke: ranks spread over $nhosts distinct host namespaces (want 4)"
echo "shaped   (--rate 1gbit): ${shaped:-n/a} Gbit/s"
echo "unshaped (--rate none) : ${unshaped:-n/a} Gbit/s"
echo "tbf bytes sent: h0/eth0=${q_h0:-n/a} br/vh1=${q_vh1:-n/a} (MPI payload ${shaped_bytes:-n/a})"
echo "elapsed: $(( SECONDS - T0 )) s"

[[ "$nhosts" == 4 ]] || { echo "FAIL: smoke did not place 4 ranks on 4 hosts"; fail=1; }
if [[ -z "$shaped" || -z "$unshaped" ]]; then
  echo "FAIL: bandwidth not measured"; fail=1
else
  awk -v s="$shaped" 'BEGIN { exit !(s > 1.5) }' && { echo "FAIL: shaped rate $shaped > 1.5 Gbit/s: shaping not in effect"; fail=1; }
  awk -v s="$shaped" 'BEGIN { exit !(s < 0.5) }' && { echo "FAIL: shaped rate $shaped < 0.5 Gbit/s: far below 1gbit"; fail=1; }
  awk -v s="$shaped" -v u="$unshaped" 'BEGIN { exit !(u < 1.5 * s) }' \
    && { echo "FAIL: unshaped $unshaped not clearly above shaped $shaped"; fail=1; }
  # both tbf qdiscs on the path must have carried (at least) the payload
  for q in "$q_h0" "$q_vh1"; do
    [[ -n "$q" && -n "$shaped_bytes" ]] && (( q >= shaped_bytes )) \
      || { echo "FAIL: a tbf qdisc on the h0->h1 path carried ${q:-?} < ${shaped_bytes:-?} bytes"; fail=1; }
  done
fi

left=$(ip netns list | awk '{print $1}' | grep -E "^${PREFIX}-" || true)
[[ -z "$left" ]] || { echo "FAIL: namespaces left behind: $left"; fail=1; }
compgen -G "/tmp/${PREFIX}.??????" >/dev/null && { echo "FAIL: temp dir left behind"; fail=1; }

if (( fail )); then echo "selftest: FAIL"; exit 1; fi
echo "selftest: PASS"
