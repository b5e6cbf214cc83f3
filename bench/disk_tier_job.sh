#!/usr/bin/env bash
# The disk tier in a whole job, beside the same job in memory: configs/deepfm.yaml
# (1 server, 1 worker, sync, TIER_EPOCHS epochs) on synthetic data whose
# vocabulary makes the sparse table large, once with every row in memory and
# once with `storage.kind: ssd` and a cache of TIER_CACHE_PERCENT of the rows
# the memory run held. Prints, for both: the held-out AUC, train samples/s,
# the table's rows and bytes, the rows on disk, and the server's peak RSS
# (VmHWM, from its last status line). The same steps are computed (sync mode:
# the disk tier holds bit for bit what memory would), so the AUCs agree.
#
#   bench/disk_tier_job.sh                                # ~1M rows, Zipf 1.05
#   TIER_ZIPF=1.4 bench/disk_tier_job.sh                  # a hot set that fits the cache
#   TIER_VOCAB=1000000 TIER_LINES=2000000 bench/disk_tier_job.sh   # ~1 GB in memory
#
# Environment: FLEET_BUILD_DIR (default build), TIER_DIR (data, logs and the
# database; default a fresh folder under /tmp, removed afterwards),
# TIER_VOCAB (ids per slot, 100000), TIER_LINES (training lines, 240000),
# TIER_ZIPF (1.05), TIER_CACHE_PERCENT (20), TIER_EPOCHS (1).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${FLEET_BUILD_DIR:-build}"
vocab="${TIER_VOCAB:-100000}"
lines="${TIER_LINES:-240000}"
zipf="${TIER_ZIPF:-1.05}"
percent="${TIER_CACHE_PERCENT:-20}"
epochs="${TIER_EPOCHS:-1}"
own_dir=0
dir="${TIER_DIR:-}"
if [ -z "$dir" ]; then
  dir="$(mktemp -d /tmp/fleet_disk_tier.XXXXXX)"
  own_dir=1
fi

cmake --build "$build" -j"$(nproc)" --target fleetrun ps_server ps_worker gen_ctr_data >/dev/null
"$build/bin/gen_ctr_data" --out_dir="$dir/data" --train_files=4 --lines_per_file=$((lines / 4)) \
  --test_files=1 --vocab="$vocab" --zipf="$zipf" | tail -1

# Runs the job with extra -o arguments; prints "auc samples/s" then the
# server's last status line's table 0 part.
run() {
  local name=$1
  shift
  "$build/bin/fleetrun" --server_num=1 --worker_num=1 --http_port=0 --log_dir="$dir/log_$name" \
    --config configs/deepfm.yaml -o "data.train=$dir/data/train" -o "data.test=$dir/data/test" \
    -o "data.oracle=$dir/data/oracle.txt" -o "train.epochs=$epochs" "$@" >"$dir/$name.out" 2>&1
  local summary status
  summary="$(grep -h 'summary:' "$dir/log_$name/workerlog.0" | tail -1)"
  status="$(grep -h 'ps_server 0:' "$dir/log_$name/serverlog.0" | tail -1)"
  echo "$summary" | sed -E 's/.*held-out auc ([0-9.]+).*, ([0-9.]+) train samples\/s.*/\1 \2/'
  echo "$status" | sed -E 's/.*(table 0: .*), table 1.*(rss [^,]*),.*/\1; \2/'
}

memory="$(run memory)"
rows="$(echo "$memory" | sed -n 2p | sed -E 's/table 0: ([0-9]+) rows.*/\1/')"
cache=$((rows * percent / 100))
disk="$(run disk -o "tables.0.storage={kind: ssd, path: '$dir/tier', cache_rows: $cache}")"

read -r mauc mrate <<<"$(echo "$memory" | head -1)"
read -r dauc drate <<<"$(echo "$disk" | head -1)"
echo "vocab $vocab, $lines lines, Zipf $zipf, $epochs epoch(s); disk tier cache_rows $cache ($percent% of $rows rows)"
printf '  memory:    held-out AUC %s, %s samples/s, %s\n' "$mauc" "$mrate" "$(echo "$memory" | sed -n 2p)"
printf '  disk tier: held-out AUC %s, %s samples/s, %s\n' "$dauc" "$drate" "$(echo "$disk" | sed -n 2p)"
awk -v a="$mauc" -v b="$dauc" -v r="$mrate" -v s="$drate" \
  'BEGIN { printf "  AUC difference %.4f, disk/memory samples/s %.2f\n", b - a, s / r }'
if [ "$own_dir" = 1 ]; then rm -rf "$dir"; fi
