#!/bin/bash
# The order in which the emoji tables of docs/results.md ("The detail tables, per study") are
# trained in the background, on the deduplicated set (format 2):
#
# 1. the tune table: every method's own hyperparameters, TUNE_RUNS candidates each, seed 0,
#    TUNE_EPOCHS epochs, selected on the validation classes only (the baseline's learning rate
#    first: the other methods train at the rate it selects);
# 2. every headline table with the selected values (--tuned), seeds 0-2 row by row, then seeds
#    3-4 (look 1 of the claims' design, experiments/emoji_claims.py), then the wider Revisiting
#    comparison at seed 0;
# 3. look 2: seeds 5-9 for both rows of every claim that look 1 leaves unresolved; a lane
#    that has finished its own look 2 then trains the free runs of the other lane's.
#
# Every call resumes: finished runs are skipped (a record of other data or other settings is
# not reused), interrupted ones continue from their last checkpoint. EPOCHS sets the headline
# budget (default 45), TUNE_EPOCHS the tuning budget (default 20), JOBS how many runs train at
# once (default 1; each on its share of the cores and of the accelerator's memory, see
# jdml.study.executor.Local: 2 on 2 CPU cores gave 1.16-1.29x the throughput of 1). RESULTS / OUT
# / TUNE_RESULTS may point elsewhere (e.g. a worktree pinned at one commit with the records
# landing in the main checkout).
#
# LANE splits the queue in two that can run side by side: "other" (the tune table, then every
# table but DM2's, the Revisiting comparison and their look 2) and "dm2" (DM2's table and its
# look 2; it needs the tune table's records, so start it once they are in); "all" (the
# default) runs both one after the other. Each call of experiments/emoji_protocol.py returns
# when its last run ends, so a call whose run count is not a multiple of JOBS leaves slots idle
# at its end; two lanes of one job each, each pinned to its own cores, leave a core idle only
# when a lane ends, and bring look 1 of the claims outside DM2 sooner (DM2's runs, a cohort of
# three networks each, are the slowest).
#
# Usage: mkdir -p runs/emoji-v2-45 &&
#          nohup nice -n 10 bash experiments/emoji_queue.sh > runs/emoji-v2-45/queue.log 2>&1 &
#        two lanes on two cores:
#          LANE=other nohup taskset -c 0 bash experiments/emoji_queue.sh > runs/other.log 2>&1 &
#          LANE=dm2 nohup taskset -c 1 bash experiments/emoji_queue.sh > runs/dm2.log 2>&1 &
set -e
cd "$(dirname "$0")/.."
# Runs of one row share their compiled programs through JAX's persistent cache: on 2 CPU cores
# a 1-epoch Sharing run took 49.8 s with the cache warm against 59.9 s without (its first epoch
# 20 s against 29-32 s), with the same test Recall@1.
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-${OUT:-runs}/xla-cache}"
epochs="${EPOCHS:-45}"
tune_epochs="${TUNE_EPOCHS:-20}"
tune_results="${TUNE_RESULTS:-experiments/results/emoji-v2-tune-$tune_epochs}"
lane="${LANE:-all}"
case "$lane" in
  all | other | dm2) ;;
  *) echo "error: LANE=$lane: use all, other or dm2" >&2 && exit 2 ;;
esac
run() {
  "${PYTHON:-python}" experiments/emoji_protocol.py --epochs "$epochs" --tuned --tune-epochs "$tune_epochs" \
    --jobs "${JOBS:-1}" --tune-results "$tune_results" --out "${OUT:-runs}/emoji-v2-$epochs" \
    --results "${RESULTS:-experiments/results/emoji-v2-$epochs}" "$@"
}
look2_rows() {  # the rows of the claims with $1 stages frozen that look 1 leaves unresolved
  "${PYTHON:-python}" experiments/emoji_claims.py --epochs "$epochs" --seeds 0 1 2 3 4 \
    --results "${RESULTS:-experiments/results/emoji-v2-$epochs}" --look2-rows "$1"
}
DM2=(--tables dm2 --frozen-stages 3 --cohort 3)
look2_other() {  # look 2 of every claim outside DM2 that look 1 leaves unresolved
  rows="$(look2_rows -1)"
  if [ -n "$rows" ]; then run --tables protocol,rho,sharing,diva --rows "$rows" --seeds 0 1 2 3 4 5 6 7 8 9; fi
}
look2_dm2() {  # look 2 of DM2's unresolved claims
  rows="$(look2_rows 3)"
  if [ -n "$rows" ]; then run "${DM2[@]}" --rows "$rows" --seeds 0 1 2 3 4 5 6 7 8 9; fi
}
if [ "$lane" != dm2 ]; then
  "${PYTHON:-python}" experiments/emoji_protocol.py --tables tune --seeds 0 --epochs "$tune_epochs" \
    --jobs "${JOBS:-1}" --out "${OUT:-runs}/emoji-v2-tune-$tune_epochs" --results "$tune_results"
  for seeds in "0 1 2" "0 1 2 3 4"; do
    # shellcheck disable=SC2086
    run --tables protocol,rho --seeds $seeds
    # shellcheck disable=SC2086
    run --tables sharing --seeds $seeds
    # shellcheck disable=SC2086
    run --tables diva --seeds $seeds
  done
  run --tables losses --seeds 0
  run --tables samplers --seeds 0
  look2_other
fi
if [ "$lane" != other ]; then
  for seeds in "0 1 2" "0 1 2 3 4"; do
    # shellcheck disable=SC2086
    run "${DM2[@]}" --seeds $seeds
  done
  look2_dm2
fi
# A lane whose own work is done helps with the other's look 2: the runs the other lane is
# training are skipped (their workdirs' locks are held), and each lane trains the next free
# one, so neither core idles while runs remain.
case "$lane" in
  other) look2_dm2 ;;
  dm2) look2_other ;;
esac
