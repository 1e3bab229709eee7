"""jdml.allocator: the programs start again under tcmalloc, once, unless told not to.

The decisions are checked in-process with ``os.execve`` replaced; one subprocess checks that a
program really ends up with tcmalloc mapped (the CI machine installs libtcmalloc-minimal4, as
the README's commands do)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jdml import allocator

PROBE = (
    "from jdml.allocator import reexec_with_tcmalloc, tcmalloc_loaded\n"
    "reexec_with_tcmalloc()\n"
    "import os\n"
    "print(tcmalloc_loaded(), os.environ.get('JDML_ALLOCATOR_ACTIVE'))\n"
)


class Exec(Exception):
    """Raised by the stand-in for os.execve, carrying its arguments."""


def _fake_execve(path, argv, env):
    raise Exec(path, argv, env)


@pytest.fixture
def clean_env(monkeypatch):
    for name in (allocator.ENV, allocator.ACTIVE_ENV, "LD_PRELOAD", allocator.REPORT_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(allocator, "tcmalloc_loaded", lambda: False)
    monkeypatch.setattr(allocator, "find_tcmalloc", lambda: "/lib/libtcmalloc_minimal.so.4")
    monkeypatch.setattr(allocator.os, "execve", _fake_execve)
    monkeypatch.setattr(sys, "platform", "linux")
    return monkeypatch


def test_starts_again_with_the_library_preloaded(clean_env):
    clean_env.setenv("LD_PRELOAD", "/opt/other.so")
    with pytest.raises(Exec) as started:
        allocator.reexec_with_tcmalloc()
    path, argv, env = started.value.args
    assert path == sys.executable and argv == list(sys.orig_argv)
    assert env["LD_PRELOAD"] == "/lib/libtcmalloc_minimal.so.4:/opt/other.so"
    assert env[allocator.ACTIVE_ENV] == "1"
    assert env[allocator.REPORT_ENV] == str(1 << 40)


@pytest.mark.parametrize(
    "setting",
    [
        {allocator.ENV: "system"},
        {allocator.ACTIVE_ENV: "1"},  # started again already (even if the preload failed)
    ],
)
def test_does_nothing_when_told_or_done(clean_env, setting):
    for name, value in setting.items():
        clean_env.setenv(name, value)
    allocator.reexec_with_tcmalloc()  # returns: no Exec


def test_does_nothing_under_tcmalloc_already(clean_env):
    clean_env.setattr(allocator, "tcmalloc_loaded", lambda: True)
    allocator.reexec_with_tcmalloc()


def test_missing_library_warns_in_auto_and_fails_when_required(clean_env, capsys):
    clean_env.setattr(allocator, "find_tcmalloc", lambda: None)
    allocator.reexec_with_tcmalloc()
    err = capsys.readouterr().err
    assert err.startswith("warning: tcmalloc is not installed") and err.count("\n") == 1
    assert "apt-get install libtcmalloc-minimal4" in err and "JDML_ALLOCATOR=system" in err
    clean_env.setenv(allocator.ENV, "tcmalloc")
    with pytest.raises(SystemExit, match=r"^error: JDML_ALLOCATOR=tcmalloc but .* apt-get"):
        allocator.reexec_with_tcmalloc()


def test_unknown_mode_is_an_error_line(clean_env):
    clean_env.setenv(allocator.ENV, "jemalloc")
    with pytest.raises(SystemExit, match=r"^error: JDML_ALLOCATOR='jemalloc' is not one of auto"):
        allocator.reexec_with_tcmalloc()


def test_find_tcmalloc_searches_the_given_folders(tmp_path):
    assert allocator.find_tcmalloc([str(tmp_path)]) is None
    (tmp_path / "libtcmalloc.so.4").write_bytes(b"")
    assert allocator.find_tcmalloc([str(tmp_path)]) == str(tmp_path / "libtcmalloc.so.4")


@pytest.mark.parametrize(("mode", "expected"), [("auto", "True 1"), ("system", "False None")])
def test_a_program_runs_under_tcmalloc(mode, expected):
    assert allocator.find_tcmalloc(), "install libtcmalloc-minimal4 (the README's commands do)"
    env = {k: v for k, v in os.environ.items() if k not in (allocator.ACTIVE_ENV, "LD_PRELOAD")}
    env[allocator.ENV] = mode
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == expected
    assert out.stderr == ""
