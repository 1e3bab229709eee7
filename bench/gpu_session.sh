#!/usr/bin/env bash
# The accelerator checks of one session on a GPU host, in one command (docs/devices.md,
# "On a GPU: what was measured"). Run from the repository root; results and logs go to $OUT
# (default /tmp/jdml-gpu).
#
#   bash bench/gpu_session.sh [steps...]
#
# steps (default: all, in this order):
#   forms    compile the glyph default's train step and evaluation pass with the forms of the
#            1x1 convolutions in $FORMS (default: matmul, the form that aborted XLA on a GPU;
#            the default form runs in every other step), each in its own process
#   tests    the suite's accelerator tests and the tests whose tolerances follow the backend;
#            the device views' colour blend against Pillow on every level pair, the own-loop
#            rules under jit (NaN for labels and tuples outside the batch), the step's record
#   quick    the README's quick start (train, then evaluate), timed
#   pipeline bench/bench_pipeline.py --quick with the automatic sizes (and torchvision's loader)
#   bench    bench/bench_gpu.py (step, eval, train), its JSON in $OUT
#   sweep    bench/bench_gpu.py --sections sweep (the evaluator's block sizes)
#   vit      the vision transformers: the ViT-S/16 and ViT-B/16 steps in float32 and bfloat16
#            against timm's in PyTorch eager and torch.compile, with MFU (bench/bench_gpu.py
#            --nets vit_s16,vit_b16, batch $VIT_BATCH, default 64; needs timm's wheel), and
#            ViT-B/16 at batch 180 in bfloat16 alone: its compiled memory and that it trains
#            (bench/bench_vit.py --jdml-only); each with model.vit.attention=cudnn in bfloat16
#            as well (cuDNN's fused attention, never run yet)
#   views    device views: their pixels against Pillow's (bench/view_fidelity.py), both view
#            paths with every augmentation and the device's work per batch, and train.py end to
#            end with ResNet-50 in bf16 for the plain method, DiVA and a DM2 cohort of 2
#            (bench/bench_pipeline.py --sections views,e2e)
#
# A host without network access takes the missing packages from wheels in .whl/ (docs/devices.md).
set -uo pipefail
OUT=${OUT:-/tmp/jdml-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ] && ! python3 -c "import grain, ml_collections" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/jdml-site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/jdml-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(forms tests quick pipeline bench)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
python3 -c "import jax, os; print('jax', jax.__version__, jax.devices(), os.cpu_count(), 'cores')"

for step in "${steps[@]}"; do
  start=$(date +%s)
  echo "=== $step"
  case $step in
    forms)
      for form in ${FORMS:-matmul}; do
        timeout 300 python3 - "$form" <<'EOF' > "$OUT/forms-$form.log" 2>&1
import sys
import jax, jax.numpy as jnp, numpy as np
from configs.revisiting import get_config
from jdml.nn import pointwise
from jdml.run import Run

# The form is an argument of the 1x1 convolutions, "auto" by default: force it for this process.
forced, resolve = sys.argv[1], pointwise.pointwise_form
pointwise.pointwise_form = lambda form="auto": resolve(forced)
run = Run(get_config())
batch = {k: jnp.asarray(v) for k, v in run.batch_maker()(0).items()}
state, metrics = run.make_train_step()(jax.tree.map(jnp.copy, run.initial_state), batch)
out = run.embed_fn(state.params, state.batch_stats, run.splits["test"].eval_images(np.arange(500)))
print("form", sys.argv[1], "compiled and ran: loss", float(metrics["loss"]))
EOF
        echo "form $form: exit $? ; $(grep -E 'Check failed|compiled and ran' "$OUT/forms-$form.log" | head -2)"
      done
      ;;
    tests)
      timeout 420 python3 -m pytest -q -rs -p no:cacheprovider -n 8 -m "gpu or not slow" \
        ${TESTS:-tests/test_accelerator.py tests/nn/test_conv.py tests/nn/test_pointwise.py \
        tests/test_throughput.py tests/evaluation/test_backend_blocks.py \
        tests/evaluation/test_evaluation.py tests/data/test_device_views.py \
        tests/test_own_loop.py tests/test_step_golden.py} > "$OUT/tests.log" 2>&1
      echo "tests: exit $?"; tail -15 "$OUT/tests.log"
      ;;
    quick)
      rm -rf /tmp/jdml-quick
      /usr/bin/time -f "quick start: %e s wall" bash -c \
        "python3 train.py --config configs/revisiting.py --workdir /tmp/jdml-quick \
         --config.train.progress_bar=False > $OUT/quick.log 2>&1 && \
         python3 eval.py --workdir /tmp/jdml-quick >> $OUT/quick.log 2>&1"
      echo "quick: exit $?"; grep -iE "pipeline|recall" "$OUT/quick.log" | tail -6
      cp /tmp/jdml-quick/metrics.jsonl "$OUT/quick-metrics.jsonl" 2>/dev/null
      python3 -c "import json, statistics; r = [json.loads(l) for l in open('/tmp/jdml-quick/metrics.jsonl')]; t = [x['img_s'] for x in r if x.get('kind') == 'train'][1:]; print('train img/s: median', round(statistics.median(t)), 'of', len(t), 'log points after the first')"
      ;;
    pipeline)
      timeout 300 python3 bench/bench_pipeline.py ${PIPELINE_ARGS:---quick} --torch-python python3 2>&1 |
        tee "$OUT/pipeline.log"
      ;;
    views)
      timeout 180 python3 bench/view_fidelity.py --views 32 2>&1 | tee "$OUT/view-fidelity.log"
      timeout 600 python3 bench/bench_pipeline.py --sections views,e2e --quick --photos 2000 \
        --e2e-methods plain,diva,dm2 --e2e-flag=--config.model.backbone=resnet50 \
        --e2e-flag=--config.model.dtype=bfloat16 --e2e-flag=--config.train.batch_size=112 \
        --e2e-flag=--config.train.epochs=4 ${VIEWS_ARGS:-} 2>&1 | tee "$OUT/views.log"
      ;;
    bench)
      timeout 600 python3 bench/bench_gpu.py --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
      ;;
    sweep)
      timeout 600 python3 bench/bench_gpu.py --sections sweep --out "$OUT" ${SWEEP_ARGS:-} 2>&1 |
        tee "$OUT/sweep.log"
      ;;
    vit)
      # Both frameworks share the GPU here: JAX allocates as it goes instead of taking 75 %.
      XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 600 python3 bench/bench_gpu.py --sections step \
        --nets vit_s16,vit_b16 --batch "${VIT_BATCH:-64}" --steps 10 --repeats 3 \
        --out "$OUT/vit" 2>&1 | tee "$OUT/vit.log"
      XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 600 python3 bench/bench_gpu.py --sections step \
        --nets vit_s16,vit_b16 --dtypes bfloat16 --vit-attention cudnn \
        --batch "${VIT_BATCH:-64}" --steps 10 --repeats 3 --out "$OUT/vit-cudnn" 2>&1 |
        tee "$OUT/vit-cudnn.log"
      for attention in xla cudnn; do
        timeout 300 python3 bench/bench_vit.py --model vit_b16 --batch 180 --dtype bfloat16 \
          --attention $attention --jdml-only --steps 5 --repeats 3 2>&1 |
          tee "$OUT/vit-b16-180-$attention.log"
      done
      ;;
    *) echo "error: unknown step $step (forms, tests, quick, pipeline, bench, sweep)"; exit 2 ;;
  esac
  echo "=== $step took $(($(date +%s) - start)) s"
done
