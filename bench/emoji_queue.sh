#!/bin/bash
# The order in which the emoji ablations are run in the background (README, "Emoji: the papers'
# protocol on real artwork"): seed 0 of every row of groups 1 and 2 first, then their second
# seeds, then group 3 at seed 0, then the third seeds, so that if the budget runs out, seeds
# are cut before rows (group 3's rows were moved ahead of the third seeds once two seeds of
# every group 1 and 2 row had landed). Every call resumes: finished runs are skipped,
# interrupted ones continue from their last checkpoint.
#
# Each finished run leaves its record in bench/results/emoji (kept in the repository); OUT and
# RESULTS move the run directories and the records, e.g. to run the queue from a worktree
# pinned at one commit while the records land in the main checkout.
#
# Usage: nohup bash bench/emoji_queue.sh > runs/emoji/queue.log 2>&1 &
set -e
cd "$(dirname "$0")/.."
run() {
  python bench/emoji_protocol.py --out "${OUT:-runs/emoji}" \
    --results "${RESULTS:-bench/results/emoji}" "$@"
}
DM2=(--tables dm2 --frozen-stages 3 --cohort 3)
run --tables diva --seeds 0
run "${DM2[@]}" --seeds 0
run --tables sharing --seeds 0
run --tables diva --seeds 0 1
run --tables sharing --seeds 0 1
run "${DM2[@]}" --seeds 0 1
run --tables losses --seeds 0
run --tables samplers --seeds 0
run --tables sharing --seeds 0 1 2
run --tables diva --seeds 0 1 2
run "${DM2[@]}" --seeds 0 1 2
# the DM2 rows once with every stage trained: does the ordering of the frozen rows hold?
run --tables dm2 --cohort 3 --seeds 0
