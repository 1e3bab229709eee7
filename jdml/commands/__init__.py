"""The absl-flag commands ``jdml train`` and ``jdml eval`` (``train.py`` and ``eval.py`` are
shims over them). Each module defines its flags when imported, so a process imports one."""
