#!/usr/bin/env bash
# perf/loss.sh end to end on loopback with tiny sizes: its table has a row per drop probability,
# the lossless row is the reference (1.00x), the lossy row shows the retransmissions and how they
# were found, and bad arguments are usage errors (exit 2). Checks the output's shape and
# consistency, never timings.
set -uo pipefail
LOSS_SH=$1 BIN_DIR=$2 WD=$3
rm -rf "$WD"
fail() { echo "FAIL: $*" >&2; [[ -f "$WD/out.txt" ]] && cat "$WD/out.txt" >&2; exit 1; }

for bad in "--drops 0.01" "--side nowhere" "--np 0" "--size 12Q" "--drops 0,x"; do
  # shellcheck disable=SC2086
  bash "$LOSS_SH" $bad --bin-dir "$BIN_DIR" --out "$WD/bad" > /dev/null 2>&1
  rc=$?
  [[ $rc -eq 2 ]] || fail "'$bad' gave exit $rc, not 2"
done

mkdir -p "$WD"
bash "$LOSS_SH" --np 2 --size 256K --drops "0 0.05" --reps 2 --iters 2 --bin-dir "$BIN_DIR" --out "$WD/run" \
  > "$WD/out.txt" 2> "$WD/err.txt" || { cat "$WD/err.txt" >&2; fail "loss.sh failed"; }
cmp -s "$WD/out.txt" "$WD/run/loss.md" || fail "stdout and loss.md differ"
rows=$(grep -E '^\| [0-9.]+ % \|' "$WD/out.txt")
[[ $(wc -l <<<"$rows") -eq 2 ]] || fail "expected 2 rows"
ref=$(sed -n 1p <<<"$rows")
lossy=$(sed -n 2p <<<"$rows")
IFS='|' read -r -a R <<<"$ref"
IFS='|' read -r -a L <<<"$lossy"
# Columns: 1 drop, 2 time, 3 ratio, 4 retx %, 5 fast, 6 timeout, 7 wait, 8 rto, 9 cwnd, 10 slots,
# 11 other, 12 cwnd, 13 cuts, 14 agg resends, 15 nmse.
[[ "${R[1]}" == " 0 % " ]] || fail "the first row is not the lossless one: ${R[1]}"
[[ "${L[1]}" == " 5 % " ]] || fail "the second row is not 5 %: ${L[1]}"
[[ "${R[3]}" == " 1.00x " ]] || fail "the reference ratio is not 1.00x: ${R[3]}"
[[ "${L[3]}" =~ ^\ [0-9.]+x\ \[[0-9.]+\.\.[0-9.]+\]\ $ ]] || fail "lossy ratio malformed: ${L[3]}"
[[ "${R[2]}" =~ ^\ [0-9.]+\ \[[0-9.]+\.\.[0-9.]+\]\ $ ]] || fail "time malformed: ${R[2]}"
awk -v r="${L[4]}" 'BEGIN { exit !(r + 0 > 0) }' || fail "5 % drop but no retransmissions: ${L[4]}"
awk -v f="${L[5]}" -v t="${L[6]}" 'BEGIN { exit !(f + t > 0) }' || fail "retransmissions found by nothing"
for c in 7 8 9 10 11 12; do
  [[ "${L[$c]}" =~ ^\ [0-9.]+\ $ ]] || fail "column $c malformed: ${L[$c]}"
done
# The split adds up: rto + cwnd + slots + other = wait (rounding of the printed figures aside).
awk -v w="${L[7]}" -v a="${L[8]}" -v b="${L[9]}" -v c="${L[10]}" -v d="${L[11]}" \
  'BEGIN { s = a + b + c + d; exit !(s > w - 0.3 && s < w + 0.3) }' || fail "the time split does not add up"
[[ "${L[15]}" =~ [0-9]e-0 ]] || fail "no nmse: ${L[15]}"
# Every run's log has the tool's row and every rank's client statistics.
for f in "$WD"/run/raw/drop*_rep*.log; do
  [[ "$f" == *.agg.log ]] && continue
  [[ $(grep -c '^thc: rank [0-9]* udp: ' "$f") -eq 2 ]] || fail "$f: not 2 ranks' statistics"
  grep -q 'final stats:' "${f%.log}.agg.log" || fail "${f%.log}.agg.log: no final statistics"
done
echo "loss.sh ok"
