#!/bin/bash
# Runs a command with a /dev/shm of its own: a tmpfs of SIZE mounted over /dev/shm in a private
# mount namespace (so a small /dev/shm, like Docker's default 64 MB, can be tried, and what a
# job leaves there is its own). Afterwards, with --no-leak, fails if the command left any
# thc-hier-* object in it; with --expect TEXT, fails unless the command's output says TEXT (the
# scenario happened). The command's own exit status decides otherwise, unless --ignore-status.
# Exit 77 (skipped) where no mount namespace can be made (not root), unless --or-shared: then the
# command runs on the shared /dev/shm and --no-leak looks at the thc-hier-* objects that appeared
# during the run.
#
#   private_shm.sh SIZE [--no-leak] [--ignore-status] [--or-shared] [--expect TEXT] -- COMMAND...
set -u
size=$1
shift
no_leak=0 ignore=0 shared=0 expect=""
while [ $# -gt 0 ]; do
  case $1 in
    --no-leak) no_leak=1 ;;
    --ignore-status) ignore=1 ;;
    --or-shared) shared=1 ;;
    --expect) expect=$2; shift ;;
    --) shift; break ;;
    *) echo "private_shm.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
list_thc() { find /dev/shm -maxdepth 1 -name 'thc-hier-*' -printf '%f %s bytes\n' 2>/dev/null | sort; }
if [ -z "${THC_PRIVATE_SHM_INSIDE:-}" ]; then
  if ! unshare -m true 2>/dev/null || ! unshare -m sh -c "mount -t tmpfs -o size=1m tmpfs /dev/shm" 2>/dev/null; then
    if [ $shared = 0 ]; then
      echo "private_shm.sh: no private mount namespace or tmpfs here (needs root / CAP_SYS_ADMIN): skipped"
      exit 77
    fi
    echo "private_shm.sh: no private mount namespace here: on the shared /dev/shm"
    before=$(list_thc)
    out=$(mktemp)
    "$@" 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    status=0
    if [ $ignore = 0 ] && [ "$rc" != 0 ]; then echo "private_shm.sh: the command failed ($rc)"; status=1; fi
    if [ -n "$expect" ] && ! grep -qF -- "$expect" "$out"; then
      echo "private_shm.sh: the scenario did not happen (no '$expect' in the output)"
      status=1
    fi
    if [ $no_leak = 1 ]; then
      left=$(comm -13 <(echo "$before") <(list_thc))
      if [ -n "$left" ]; then echo "private_shm.sh: left behind in /dev/shm:"; echo "$left"; status=1; fi
    fi
    rm -f "$out"
    exit $status
  fi
  args=("$size")
  [ $no_leak = 1 ] && args+=(--no-leak)
  [ $ignore = 1 ] && args+=(--ignore-status)
  [ -n "$expect" ] && args+=(--expect "$expect")
  exec env THC_PRIVATE_SHM_INSIDE=1 unshare -m --propagation private "$0" "${args[@]}" -- "$@"
fi
mount -t tmpfs -o "size=$size" tmpfs /dev/shm || { echo "private_shm.sh: cannot mount a tmpfs on /dev/shm: skipped"; exit 77; }
echo "private_shm.sh: /dev/shm is a private tmpfs of $size"
out=$(mktemp)
"$@" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
status=0
if [ $ignore = 0 ] && [ "$rc" != 0 ]; then
  echo "private_shm.sh: the command failed ($rc)"
  status=1
fi
if [ -n "$expect" ] && ! grep -qF -- "$expect" "$out"; then
  echo "private_shm.sh: the scenario did not happen (no '$expect' in the output)"
  status=1
fi
if [ $no_leak = 1 ]; then
  left=$(list_thc)
  if [ -n "$left" ]; then
    echo "private_shm.sh: left behind in /dev/shm:"
    echo "$left"
    status=1
  else
    echo "private_shm.sh: nothing of thc left in /dev/shm"
  fi
fi
rm -f "$out"
exit $status
