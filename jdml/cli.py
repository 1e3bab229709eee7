"""Shared command-line behaviour: known errors become one clear message and a non-zero exit."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator

from jdml.errors import CheckpointError, ConfigError, UnknownNameError
from jdml.keys import RENAMED_KEYS

EXIT_USAGE = 2


def known_errors() -> tuple[type[BaseException], ...]:
    from jdml.errors import (
        DataError,
        NonFiniteEmbeddingError,
        NonFiniteLossError,
        OutputPathError,
        WeightFileError,
        WeightMismatchError,
        WorkdirError,
    )

    return (
        ConfigError,
        DataError,
        CheckpointError,
        UnknownNameError,
        NonFiniteLossError,
        NonFiniteEmbeddingError,
        OutputPathError,
        WorkdirError,
        WeightFileError,
        WeightMismatchError,
        FileNotFoundError,
    )


def from_storage_layer(record: logging.LogRecord) -> bool:
    """Whether a log record comes from the checkpoint storage layer (orbax, TensorStore), or
    reports an error raised there (asyncio's "exception was never retrieved")."""
    if any(part in record.pathname for part in ("orbax", "tensorstore")):
        return True
    error = record.exc_info[1] if record.exc_info else None
    return error is not None and _in_storage_layer(error)


def quiet_storage_layer() -> None:
    """Keeps the storage layer's messages (a failed save's tracebacks, run to hundreds of
    lines by its background threads) off the terminal: a command says what failed in one
    line, and a training run keeps their full text in ``train.log``
    (``jdml.trainer.setup_logging``)."""
    from absl import logging as absl_logging

    handler = absl_logging.get_absl_handler()
    if not any(f is _terminal_filter for f in handler.filters):
        handler.addFilter(_terminal_filter)
    if sys.unraisablehook is not _unraisable:
        global _default_unraisable
        _default_unraisable = sys.unraisablehook
        sys.unraisablehook = _unraisable


_default_unraisable = sys.unraisablehook


def _unraisable(unraisable: object) -> None:
    """Errors no code can catch, already reported in one line, go to the log file: after a
    failed checkpoint read, the storage layer's reads still in flight (completing into its
    closed event loop, or collected unfinished); after a failed allocation, JAX's exit hooks
    waiting on the failed computation. Any other goes to Python's own hook."""
    error = getattr(unraisable, "exc_value", None)
    late_read = isinstance(error, RuntimeError) and str(error) == "Event loop is closed"
    if late_read or (error is not None and (out_of_memory(error) or _in_storage_layer(error))):
        logging.getLogger("jdml").info("after the error: %s", error, extra={"file_only": True})
        return
    _default_unraisable(unraisable)


def _in_storage_layer(error: BaseException) -> bool:
    """Whether ``error`` was raised inside the storage layer (a read of a damaged checkpoint
    whose coroutine is collected after the error was reported)."""
    tb = error.__traceback__
    while tb is not None:
        if any(part in tb.tb_frame.f_code.co_filename for part in ("orbax", "tensorstore")):
            return True
        tb = tb.tb_next
    return False


def _terminal_filter(record: logging.LogRecord) -> bool:
    return not from_storage_layer(record)


def error_line(error: BaseException) -> str:
    """The one ``error:`` line for an expected failure (a write that failed names its file)."""
    from jdml.workdir import describe_os_error

    if isinstance(error, OSError) and not isinstance(error, FileNotFoundError):
        return f"error: {describe_os_error(error, 'a file')}"
    return f"error: {error}"


def run_cli(fn: Callable[[], None], extra: tuple[type[BaseException], ...] = ()) -> None:
    """Runs ``fn`` under :func:`cli_errors`."""
    with cli_errors(extra):
        fn()


@contextlib.contextmanager
def cli_errors(extra: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """An expected failure inside becomes ``error: <message>`` and exit status 2.

    Expected failures are the library's own errors (bad config, data, checkpoints, weights, a
    workdir in use), ``extra`` ones, and files that cannot be written (permissions, a full disk).
    """
    from absl import logging as absl_logging

    from jdml.errors import RunInterruptedError

    absl_logging.set_verbosity(absl_logging.WARNING)  # checkpoint libraries log every file write
    quiet_storage_layer()
    try:
        yield
    except RunInterruptedError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(128 + e.signum)
    except (*known_errors(), *extra, OSError) as e:
        if type(e) is OSError and e.errno is None:  # not a file-system error: a real bug
            raise
        print(error_line(e), file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except Exception as e:
        if not out_of_memory(e):
            raise
        logging.getLogger("jdml").debug("out of memory", exc_info=True)  # the log file has it
        print(f"error: {OUT_OF_MEMORY} ({first_line(e)})", file=sys.stderr)
        sys.exit(EXIT_USAGE)


#: The one line of a run that does not fit the memory of its device or host.
OUT_OF_MEMORY = (
    "out of memory: the sizes of this run do not fit the device; lower those that set them "
    "(train.batch_size, model.embed_dim, data.image_size, eval.batch_size; cohort.size for "
    "a cohort) or use --config.model.dtype=bfloat16"
)


def first_line(error: BaseException) -> str:
    """The first line of an error's message (its type's name if it has none)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation that failed: the host's (``MemoryError``) or XLA's
    (a runtime error naming RESOURCE_EXHAUSTED or an allocation out of memory)."""
    if isinstance(error, MemoryError):
        return True
    text = str(error)
    runtime = type(error).__name__ in ("JaxRuntimeError", "XlaRuntimeError")
    return runtime and ("RESOURCE_EXHAUSTED" in text or "Out of memory" in text)


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
            old = name.removeprefix("config.")
            if old in RENAMED_KEYS:
                return f"--{name} is now --config.{RENAMED_KEYS[old]}; use that flag instead"
            close = difflib.get_close_matches(name, keys, n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join('--' + c for c in close)}?" if close else ""
            return f"unknown config key --{name}{hint} (see the config file for every key)"
    return f"invalid command-line flags: {error}"


def _config_spec(argv: list[str], flag: str) -> str | None:
    """The value of ``--flag=path[:arg]`` (or ``--flag path``), or None."""
    spec_arg = None
    for i, a in enumerate(argv):
        if a.startswith(f"--{flag}="):
            spec_arg = a.split("=", 1)[1]
        elif a == f"--{flag}" and i + 1 < len(argv):
            spec_arg = argv[i + 1]
    return spec_arg


def _read_config_file(argv: list[str], flag: str):
    """``(config, None)`` from the config file of ``--flag``, or ``(None, the exception)`` it
    raised (``(None, None)`` without the flag). The file is the user's Python config: running
    it is what the flag asks for."""
    import importlib.util

    spec_arg = _config_spec(argv, flag)
    if spec_arg is None:
        return None, None
    path, _, arg = spec_arg.partition(":")
    try:
        spec = importlib.util.spec_from_file_location("_jdml_cli_config", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if not hasattr(module, "get_config"):
            return None, AttributeError("get_config")
        config = module.get_config(arg) if arg else module.get_config()
    except Exception as e:  # the file's own failure, reported in one line
        return None, e
    if not _is_config(config):
        return None, NotAConfigError(type(config).__name__)
    return config, None


class NotAConfigError(TypeError):
    """A config file's ``get_config`` returned something else than a ``ConfigDict`` (its
    type's name is the message)."""


def _is_config(value: object) -> bool:
    """Whether ``value`` is an ``ml_collections.ConfigDict`` (frozen ones included)."""
    import ml_collections

    return isinstance(value, ml_collections.ConfigDict)


def not_a_config(path: str, returned: str) -> str:
    """The line for a config file whose ``get_config`` returned ``returned`` (a type's name)
    instead of a ``ConfigDict``."""
    what = (
        "None (is its return statement missing?)" if returned == "NoneType" else (f"a {returned}")
    )
    return (
        f"config file {path}: get_config() returned {what}, not an ml_collections.ConfigDict; "
        "return one, e.g. ml_collections.ConfigDict({...}) or configs.revisiting.get_config() "
        "with your changes (see configs/revisiting.py)"
    )


def _load_config_file(argv: list[str], flag: str):
    """Loads the config named by ``--flag=path[:arg]`` (or ``--flag path``) or returns None."""
    return _read_config_file(argv, flag)[0]


def config_file_problem(argv: list[str], flag: str) -> str | None:
    """One line for a config file that fails on its own (does not parse, lacks
    ``get_config``, or raises in it), or None if it loads."""
    _, error = _read_config_file(argv, flag)
    if error is None:
        return None
    path = (_config_spec(argv, flag) or "").partition(":")[0]
    if isinstance(error, SyntaxError):
        return (
            f"config file {path} does not parse: line {error.lineno}: {error.msg}; fix the "
            "file (python -m py_compile shows the place)"
        )
    if isinstance(error, NotAConfigError):
        return not_a_config(path, str(error))
    if isinstance(error, AttributeError) and str(error) == "get_config":
        return (
            f"config file {path} defines no get_config(); a config file returns its "
            "ml_collections.ConfigDict from get_config(arg='') (see configs/revisiting.py)"
        )
    if type(error).__name__ in ("ConfigError", "UnknownNameError"):
        return str(error)
    where = ""
    tb = error.__traceback__
    while tb is not None:  # the innermost line of the config file itself
        if tb.tb_frame.f_code.co_filename == path:
            where = f" (line {tb.tb_lineno})"
        tb = tb.tb_next
    return f"config file {path} failed in get_config(){where}: {type(error).__name__}: {error}"


def _config_file_error(message: str) -> str:
    """The message of an error raised inside a config file's ``get_config`` (ml_collections
    embeds the whole traceback in it): its last line, without the exception's module path."""
    if "Error whilst parsing config file" not in message:
        return message
    last = [line.strip() for line in message.splitlines() if line.strip()][-1]
    name, sep, text = last.partition(": ")
    if sep and name.rsplit(".", 1)[-1] in ("ConfigError", "UnknownNameError"):
        return text
    return f"the config file failed: {last}"


def resolved_config_argv(argv: list[str], flag: str = "config", *, saved: bool = True) -> list[str]:
    """Maps ``--config`` values onto config files that exist:

    * ``<file>.json`` (a run's stored config.json) onto ``configs/saved.py``, the config file
      that reads it as JSON (nothing in it is executed);
    * a method config that is not there (``configs/revisiting.py``, ``revisiting`` or
      ``revisiting.py``, with its ``:args``) onto the copy installed with the package, so that
      ``jdml train`` runs from any folder; a missing file in any other folder stays as given
      (and is reported missing).

    With ``saved=False`` only the second mapping is done.
    """
    import os

    import configs
    import configs.saved

    def mapped(value: str) -> str:
        if value.endswith(".json"):
            return f"{configs.saved.__file__}:{value}" if saved else value
        path, sep, args = value.partition(":")
        if os.path.isfile(path) or os.path.normpath(os.path.dirname(path)) not in (".", "configs"):
            return value  # an existing file, or one in a folder of the user's: as given
        name = os.path.basename(path)
        name = name if name.endswith(".py") else f"{name}.py"
        packaged = os.path.join(os.path.dirname(configs.__file__), name)
        return f"{packaged}{sep}{args}" if os.path.isfile(packaged) else value

    out = list(argv)
    for i, arg in enumerate(out):
        if arg.startswith(f"--{flag}="):
            out[i] = f"--{flag}=" + mapped(arg.split("=", 1)[1])
        elif arg == f"--{flag}" and i + 1 < len(out):
            out[i + 1] = mapped(out[i + 1])
    return out


def _missing_config_file(argv: list[str], flag: str = "config") -> str | None:
    """A message if the ``--config`` file does not exist (ml_collections defers that error)."""
    import os

    for i, arg in enumerate(argv):
        value = None
        if arg.startswith(f"--{flag}="):
            value = arg.split("=", 1)[1]
        elif arg == f"--{flag}" and i + 1 < len(argv):
            value = argv[i + 1]
        if value is not None and not os.path.isfile(value.split(":", 1)[0]):
            return (
                f"config file {value.split(':', 1)[0]} does not exist; use a method config "
                "(revisiting, diva, sharing or dm2: configs/<name>.py, found from any folder) "
                "or a run's config.json"
            )
    return None


@contextlib.contextmanager
def _quiet_none_warning() -> Iterator[None]:
    """Keeps ml_collections' warning about a ``get_config`` that returned None off the
    terminal: the one ``error:`` line says it."""

    def keep(record: logging.LogRecord) -> bool:
        return "get_config() returned None" not in record.getMessage()

    absl = logging.getLogger("absl")
    absl.addFilter(keep)
    try:
        yield
    finally:
        absl.removeFilter(keep)


def flags_parser(config_flag_name: str = "config") -> Callable[[list[str]], list[str]]:
    """An ``absl.app.run`` flags parser that reports bad config overrides in one clear line."""
    from absl import flags

    def parse(argv: list[str]) -> list[str]:
        argv = resolved_config_argv(argv, config_flag_name, saved=False)
        missing = _missing_config_file(argv, config_flag_name)
        if missing:
            print(f"error: {missing}", file=sys.stderr)
            sys.exit(EXIT_USAGE)
        argv = resolved_config_argv(argv, config_flag_name)
        try:
            with _quiet_none_warning():
                rest = flags.FLAGS(argv)
            # eval.py has no config flag: nothing of it to check
            value = flags.FLAGS[config_flag_name].value if config_flag_name in flags.FLAGS else None
            if value is None or _is_config(value):
                return rest
            path = (_config_spec(argv, config_flag_name) or "").partition(":")[0]
            print(f"error: {not_a_config(path, type(value).__name__)}", file=sys.stderr)
        except flags.Error as e:
            problem = config_file_problem(argv, config_flag_name)
            if not isinstance(_read_config_file(argv, config_flag_name)[1], NotAConfigError):
                problem = _config_file_error(str(e))
            print(f"error: {problem}", file=sys.stderr)
        except Exception as e:
            problem = config_file_problem(argv, config_flag_name)
            if problem is None and not isinstance(
                e, AttributeError | KeyError | TypeError | ValueError
            ):
                raise
            if problem is None:
                config_value = _load_config_file(argv, config_flag_name)
                problem = explain_override_error(argv, config_value, e)
            print(f"error: {problem}", file=sys.stderr)
        sys.exit(EXIT_USAGE)

    return parse
