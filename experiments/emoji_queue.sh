#!/bin/bash
# The order in which the emoji ablations are run in the background (docs/results.md, "Emoji: the
# papers' protocol on real artwork"): seed 0 of every row of groups 1 and 2 first (rho, DiVA, Sharing,
# DM2), then their second seeds, then group 3 at seed 0, then the third seeds, so that if the
# budget runs out, seeds are cut before rows and group 3's rows before groups 1 and 2. Every
# call resumes: finished runs are skipped, interrupted ones continue from their last
# checkpoint.
#
# EPOCHS sets the budget of every row (default 45; records of another budget are not reused).
# Each finished run leaves its record in RESULTS (default experiments/results/emoji-$EPOCHS, kept
# in the repository); OUT (default runs/emoji-$EPOCHS) holds the run directories. Both may point
# elsewhere, e.g. to run the queue from a worktree pinned at one commit while the records land
# in the main checkout.
#
# Usage: mkdir -p runs/emoji-45 &&
#          nohup bash experiments/emoji_queue.sh > runs/emoji-45/queue.log 2>&1 &
#        EPOCHS=20 OUT=/elsewhere/runs RESULTS=/elsewhere/results nohup bash ... &
set -e
cd "$(dirname "$0")/.."
run() {
  local epochs="${EPOCHS:-45}"
  python experiments/emoji_protocol.py --epochs "$epochs" --out "${OUT:-runs/emoji-$epochs}" \
    --results "${RESULTS:-experiments/results/emoji-$epochs}" "$@"
}
DM2=(--tables dm2 --frozen-stages 3 --cohort 3)
for seeds in "0" "0 1"; do
  # shellcheck disable=SC2086
  run --tables protocol,rho --seeds $seeds
  # shellcheck disable=SC2086
  run --tables diva --seeds $seeds
  # shellcheck disable=SC2086
  run --tables sharing --seeds $seeds
  # shellcheck disable=SC2086
  run "${DM2[@]}" --seeds $seeds
done
run --tables losses --seeds 0
run --tables samplers --seeds 0
run --tables protocol,rho --seeds 0 1 2
run --tables diva --seeds 0 1 2
run --tables sharing --seeds 0 1 2
run "${DM2[@]}" --seeds 0 1 2
# DM2 against Independent once with every stage trained: does the frozen rows' ordering hold?
# (about 20 minutes per row; all five rows ran with every stage trained at 20 epochs)
run --tables dm2 --cohort 3 --seeds 0 --rows dm2-3-independent,dm2-3-md+td+vd
