#!/usr/bin/env bash
# Builds the two folders experiments/emoji_device.sh needs carried to an accelerator host that
# has no package registry and no emoji set (docs/devices.md):
#   .emoji-cache/emoji/  the built emoji set (emoji.npz, manifest.json), built first if missing;
#   .whl-emoji/          cp312 manylinux wheels of what that host lacks, at the versions of this
#                        venv (grain, array_record, ml_collections, portpicker, tensorboardX, the
#                        packaged EfficientNet-Lite0 weights, and Optuna with its dependencies
#                        for `jdml study run`).
# Run from a venv with jdml installed (`pip install -e ".[glyphs,study]"`); PYTHON overrides
# `python`.
# Both folders are git-ignored and together stay under the 64 MiB a device call carries.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
HOST_PYTHON=${HOST_PYTHON:-3.12} # the accelerator host's Python

cache="${JDML_CACHE:-$HOME/.cache/jdml}/emoji"
if [ ! -f "$cache/emoji.npz" ] || [ ! -f "$cache/manifest.json" ]; then
  "$PYTHON" -m jdml data fetch emoji
fi
mkdir -p .emoji-cache/emoji
cp "$cache/emoji.npz" "$cache/manifest.json" .emoji-cache/emoji/

packages='grain|array.record|ml.collections|portpicker|tensorboardx|efficientnet.lite0.pytorch.model'
packages+='|optuna|alembic|sqlalchemy|colorlog|mako'
mapfile -t pins < <("$PYTHON" -m pip list --format=freeze 2> /dev/null | grep -i -E "^($packages)==")
if [ "${#pins[@]}" -ne 11 ]; then
  echo "error: this venv has ${#pins[@]} of the 11 packages to carry (${pins[*]:-none}); install" \
    'them with pip install -e ".[glyphs,study]" and run again' >&2
  exit 1
fi
rm -rf .whl-emoji
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$HOST_PYTHON" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl-emoji "${pins[@]}"
du -sh .emoji-cache .whl-emoji
echo "carry: [\".emoji-cache\", \".whl-emoji\"]; on the host: bash experiments/emoji_device.sh"
