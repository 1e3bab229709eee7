"""A run's stored ``config.json`` as a config file: continue or extend a run as it was trained.

  python train.py --config runs/glyphs/config.json --workdir runs/glyphs --config.train.epochs=20

``train.py`` maps a ``--config`` ending in ``.json`` onto this file; spelled out, the same is
``--config configs/saved.py:runs/glyphs/config.json``. The file is read as JSON: nothing in it is
executed. Keys added to jdml after the run was written get their defaults, which keep the
behaviour the run was trained with; a key jdml does not read, or a value of the wrong type, is
refused before anything runs, as on the command line.
"""

from __future__ import annotations

import json
import os

import ml_collections

from jdml.config import saved_config
from jdml.errors import ConfigError


def get_config(path: str = "") -> ml_collections.ConfigDict:
    """Reads ``path`` (a ``config.json``, or a run directory holding one)."""
    if not path:
        raise ConfigError("give the stored config: --config configs/saved.py:<run>/config.json")
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path) as f:
            return saved_config(f.read(), keep_unknown=True)
    except FileNotFoundError:
        raise ConfigError(
            f"{path} does not exist; give the config.json of a run directory (written by train.py)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError, TypeError) as e:
        raise ConfigError(f"{path} is not a readable run config ({e}); restore the file") from None
