"""Shared command-line behaviour: known errors become one clear message and a non-zero exit."""

from __future__ import annotations

import sys
from collections.abc import Callable

from jdml.checkpoint import CheckpointError
from jdml.config import ConfigError
from jdml.registry import UnknownNameError

EXIT_USAGE = 2


def known_errors() -> tuple[type[BaseException], ...]:
    from jdml.data.sources import DataError
    from jdml.trainer import NonFiniteLossError

    return (
        ConfigError,
        DataError,
        CheckpointError,
        UnknownNameError,
        NonFiniteLossError,
        FileNotFoundError,
    )


def run_cli(fn: Callable[[], None]) -> None:
    """Runs ``fn``; an expected failure prints ``error: <message>`` and exits with status 2."""
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.WARNING)  # checkpoint libraries log every file write
    try:
        fn()
    except known_errors() as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def _config_keys(config, prefix: str = "config") -> list[str]:
    out = []
    for key, value in config.items():
        name = f"{prefix}.{key}"
        out.append(name)
        if hasattr(value, "items"):
            out.extend(_config_keys(value, name))
    return out


def explain_override_error(argv: list[str], config_value, error: BaseException) -> str:
    """Turns a failed ``--config.x.y=...`` override into a message naming the key and close ones."""
    import difflib

    keys = _config_keys(config_value) if config_value is not None else []
    for arg in argv[1:]:
        if not arg.startswith("--config."):
            continue
        name = arg[2:].split("=", 1)[0]
        if keys and name not in keys:
            close = difflib.get_close_matches(name, keys, n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join('--' + c for c in close)}?" if close else ""
            return f"unknown config key --{name}{hint} (see the config file for every key)"
    return f"invalid command-line flags: {error}"


def _load_config_file(argv: list[str], flag: str):
    """Loads the config named by ``--flag=path[:arg]`` (or ``--flag path``) or returns None."""
    import importlib.util

    spec_arg = None
    for i, a in enumerate(argv):
        if a.startswith(f"--{flag}="):
            spec_arg = a.split("=", 1)[1]
        elif a == f"--{flag}" and i + 1 < len(argv):
            spec_arg = argv[i + 1]
    if spec_arg is None:
        return None
    path, _, arg = spec_arg.partition(":")
    try:
        spec = importlib.util.spec_from_file_location("_jdml_cli_config", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.get_config(arg) if arg else module.get_config()
    except Exception:
        return None


def flags_parser(config_flag_name: str = "config") -> Callable[[list[str]], list[str]]:
    """An ``absl.app.run`` flags parser that reports bad config overrides in one clear line."""
    from absl import flags

    def parse(argv: list[str]) -> list[str]:
        try:
            return flags.FLAGS(argv)
        except flags.Error as e:
            print(f"error: {e}", file=sys.stderr)
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            config_value = _load_config_file(argv, config_flag_name)
            print(f"error: {explain_override_error(argv, config_value, e)}", file=sys.stderr)
        sys.exit(EXIT_USAGE)

    return parse
