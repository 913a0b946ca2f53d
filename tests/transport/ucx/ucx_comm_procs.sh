#!/usr/bin/env bash
# Runs ucx_comm_procs as SIZE processes on this host (no MPI, no launcher: rank, size and the
# rendezvous address on the command line, as torchrun's environment gives them).
#   ucx_comm_procs.sh BINARY SIZE ok|die
# ok: every process exits 0 and every rank printed the same checksums.
# die: the last rank exits after one call; every other rank exits 0 (its next call failed with
#      THC_ERR_TRANSPORT or THC_ERR_TIMEOUT within THC_TIMEOUT_MS, set low here).
set -u
bin=$1 size=$2 mode=$3
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export THC_TIMEOUT_MS=${THC_TIMEOUT_MS:-5000}
pids=()
for ((r = 0; r < size; r++)); do
  "$bin" "127.0.0.1:$port" "$r" "$size" "$mode" >"$dir/out$r" 2>"$dir/err$r" &
  pids+=($!)
done
rc=0
for ((r = 0; r < size; r++)); do
  if ! wait "${pids[$r]}"; then
    echo "rank $r failed:"; cat "$dir/err$r"; rc=1
  fi
done
if [[ $mode == ok && $rc == 0 ]]; then
  for ((r = 1; r < size; r++)); do
    if ! cmp -s "$dir/out0" "$dir/out$r"; then echo "rank $r's results differ from rank 0's"; rc=1; fi
  done
  [[ $(wc -l <"$dir/out0") == 20 ]] || { echo "rank 0 printed $(wc -l <"$dir/out0") checksums, not 20"; rc=1; }
fi
for ((r = 0; r < size; r++)); do sed "s/^/[rank $r] /" "$dir/err$r"; done
[[ $rc == 0 ]] && echo "ucx_comm_procs $mode: $size processes passed"
exit $rc
