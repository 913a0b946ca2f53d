#!/usr/bin/env bash
# Runs switch_capi_test (the C API's aggregator communicator on the switch) inside a host
# namespace of the BMv2 testbed (ctest p4_bmv2_capi).
#
#   bmv2_capi_test.sh THC_SWITCHD THC_AGGREGATOR SWITCH_CAPI_TEST THC_PROBE
set -u
THC_SWITCHD=$1 THC_AGGREGATOR=$2 GTEST=$3 THC_PROBE=$4
TAG=thcca
# A short idle timeout: the 1 MB call on two workers sends data for several times as long
# (about 9 s through BMv2) without any control message, so the job survives only if thc-switchd
# sees the data plane's counters move.
SWITCHD_EXTRA=(--job-idle-timeout "${THC_TEST_IDLE_S:-3}" --poll-interval 1)
source "$(dirname "$0")/bmv2_testbed.sh"
testbed_up 1
ip netns exec "${HOSTNS[0]}" env THC_TEST_SWITCH_URL="$SWITCH_URL" THC_TEST_REF_URL="$REF_URL" \
  THC_AGGREGATOR_KEY_FILE="$THC_KEYS" timeout 900 "$GTEST" --gtest_color=no 2>&1 | tee "$TMP/gtest.log"
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] || die "switch_capi_test failed ($rc)"
grep -q "refused (quorum\|not supported\|takes no quorum" "$TMP/switchd.log" "$TMP/gtest.log" || true
after=$(switchd_stats) || die "no STATS from thc-switchd"
echo "thc-switchd: $after"
[ "$(stat "$after" drop_not_supported)" -gt 0 ] || die "thc-switchd did not refuse the quorum job"
[ "$(stat "$after" drop_data_plane)" = 0 ] || die "data packets reached thc-switchd"
[ "$(stat "$after" jobs_expired)" = 0 ] || die "a busy job expired: the data plane's traffic did not keep it alive"
echo "PASS"
