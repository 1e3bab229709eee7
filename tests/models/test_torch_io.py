"""The PyTorch / safetensors reader: fixtures written by real torch, hostile and damaged files.

torch is not needed: the fixtures in tests/golden/torch_io come from tools/make_torch_fixtures.py,
and every hostile or damaged file is built here with the standard pickle, struct and zipfile
modules (hand-assembled pickle opcodes where a global must name torch).
"""

from __future__ import annotations

import argparse
import collections
import os
import pickle
import shutil
import struct
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from jdml.errors import UnsafeWeightFileError, WeightFileError
from jdml.models.pretrained.torch_io import (
    detect_format,
    find_state_dict,
    load_torch_object,
    load_weights,
)
from tests.helpers import GOLDEN

DATA = Path(GOLDEN) / "torch_io"
EXPECTED = dict(np.load(DATA / "expected.npz"))
STANDINS = {key: np.dtype(getattr(ml_dtypes, name)) for key, name in EXPECTED["standin_dtypes"]}
FIXTURES = {
    "flat_zip.pt": "flat",
    "flat_legacy.pt": "flat",
    "flat.safetensors": "flat",
    "flat_zip_bigendian.pt": "flat",
    "module_zip.pt": "module",
    "module_legacy.pt": "module",
    "nested_zip.pt": "nested",
    "nested_legacy.pt": "nested",
}


def assert_matches(weights: dict[str, np.ndarray], group: str) -> None:
    """``weights`` equal the arrays torch reported for ``group``: names, dtypes, shapes, values."""
    names = {k.split("/", 1)[1] for k in EXPECTED if k.startswith(f"{group}/")}
    assert set(weights) == names
    for name, got in weights.items():
        want = EXPECTED[f"{group}/{name}"]
        dtype = STANDINS.get(f"{group}/{name}", want.dtype)
        assert (got.dtype, got.shape) == (dtype, want.shape), name
        np.testing.assert_array_equal(got.astype(want.dtype), want, err_msg=name)
        assert got.flags.c_contiguous and got.flags.owndata and got.flags.writeable, name


# A hand assembler for protocol-2 pickles, so a test can name torch globals without torch.
class G:
    def __init__(self, dotted: str) -> None:
        self.module, _, self.name = dotted.rpartition(".")


class Call:  # REDUCE
    def __init__(self, fn: Any, *args: Any) -> None:
        self.fn, self.args = fn, args


class Pid:  # BINPERSID
    def __init__(self, pid: Any) -> None:
        self.pid = pid


class Build:  # BUILD
    def __init__(self, obj: Any, state: Any) -> None:
        self.obj, self.state = obj, state


def ops(x: Any) -> bytes:
    """The opcodes that push ``x``: G, Call, Pid, Build, containers, ints, strings, bools."""
    if isinstance(x, G):
        return f"c{x.module}\n{x.name}\n".encode()
    if isinstance(x, Call):
        return ops(x.fn) + ops(x.args) + b"R"
    if isinstance(x, Pid):
        return ops(x.pid) + b"Q"
    if isinstance(x, Build):
        return ops(x.obj) + ops(x.state) + b"b"
    if isinstance(x, tuple):
        return b"(" + b"".join(map(ops, x)) + b"t"
    if isinstance(x, list):
        return b"](" + b"".join(map(ops, x)) + b"e"
    if isinstance(x, dict):
        return b"}(" + b"".join(ops(k) + ops(v) for k, v in x.items()) + b"u"
    if isinstance(x, bool) or x is None:
        return {True: b"\x88", False: b"\x89", None: b"N"}[x]
    if isinstance(x, int):
        return b"\x8a" + bytes([len(raw := x.to_bytes(16, "little", signed=True))]) + raw
    if isinstance(x, str):
        return b"X" + struct.pack("<I", len(x.encode())) + x.encode()
    raise TypeError(x)


def pickled(x: Any) -> bytes:
    """A whole protocol-2 pickle of ``x``."""
    return b"\x80\x02" + ops(x) + b"."


def tensor(key: str, storage: str, numel: int, offset: int, size: tuple, stride: tuple) -> Call:
    """A tensor as torch pickles it: _rebuild_tensor_v2 on a persistent storage reference."""
    pid = Pid(("storage", G(f"torch.{storage}"), key, "cpu", numel))
    hooks = Call(G("collections.OrderedDict"))
    return Call(G("torch._utils._rebuild_tensor_v2"), pid, offset, size, stride, False, hooks)


def write_zip(path: Path, data_pkl: bytes, storages: dict[str, bytes], **extra: bytes) -> Path:
    """A zip-format checkpoint; ``extra`` adds entries such as ``byteorder``."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", data_pkl)
        for key, raw in storages.items():
            z.writestr(f"archive/data/{key}", raw)
        for name, raw in extra.items():
            z.writestr(f"archive/{name}", raw)
    return path


def write_legacy(
    path: Path, main: bytes, storages: dict[str, tuple[int, bytes]], order: str = "<"
) -> Path:
    """A legacy-format checkpoint; ``storages`` maps key -> (element count, raw bytes)."""
    info = pickled({"little_endian": order == "<"})
    head = pickled(0x1950A86A20F9469CFC6C) + pickled(1001) + info
    body = b"".join(struct.pack(f"{order}q", n) + raw for n, raw in storages.values())
    path.write_bytes(head + main + pickled(list(storages)) + body)
    return path


FLOATS = np.arange(6, dtype=np.float32).tobytes()


@pytest.mark.parametrize("fixture", sorted(FIXTURES))
def test_fixture_equals_what_torch_reported(fixture: str) -> None:
    assert_matches(load_weights(DATA / fixture), FIXTURES[fixture])


@pytest.mark.parametrize("fixture", ["flat_zip.pt", "flat_legacy.pt", "flat.safetensors"])
@pytest.mark.parametrize("new_name", ["weights.bin", "weights", "weights.safetensors", "x.pt"])
def test_format_is_told_from_content_not_suffix(fixture: str, new_name: str, tmp_path: Path):
    want = {"flat_zip.pt": "torch-zip", "flat_legacy.pt": "torch-legacy"}
    path = shutil.copy(DATA / fixture, tmp_path / new_name)
    assert detect_format(path) == want.get(fixture, "safetensors")
    assert_matches(load_weights(path), "flat")


def test_views_become_independent_copies() -> None:
    weights = load_weights(DATA / "flat_zip.pt")
    before = weights["shared_b"].copy()
    weights["shared_a"][:] = 0  # shared one storage in the file
    np.testing.assert_array_equal(weights["shared_b"], before)
    assert weights["transposed"].shape == (6, 4) and weights["scalar"].shape == ()


def test_checkpoint_tree_and_data_parallel_prefix() -> None:
    tree = load_torch_object(DATA / "nested_legacy.pt")
    assert (tree["epoch"], tree["best_acc"], tree["arch"]) == (3, 0.875, "tiny-convnet")
    assert tree["flags"] == (True, None, [1, 2])
    assert all(k.startswith("module.") for k in tree["state_dict"])
    assert tree["optimizer"]["param_groups"][0]["lr"] == 0.1
    for index, state in tree["optimizer"]["state"].items():
        np.testing.assert_array_equal(
            state["momentum_buffer"], EXPECTED[f"nested_momentum/{index}"]
        )
    # torch pickles a state dict's _metadata with BUILD; it is dropped, the type is plain
    assert type(load_torch_object(DATA / "module_zip.pt")) is collections.OrderedDict


def test_find_state_dict_order_key_and_prefix() -> None:
    a, b = np.zeros(1), np.ones(1)
    ckpt = {"state_dict_ema": {"w": b}, "state_dict": {"module.w": a}, "epoch": 1}
    assert find_state_dict(ckpt) == {"w": a}
    assert find_state_dict(ckpt, key="state_dict_ema") == {"w": b}
    assert find_state_dict({"model": {"state_dict": {"w": a}}}) == {"w": a}
    assert set(find_state_dict({"module.w": a, "head.w": b})) == {"module.w", "head.w"}
    with pytest.raises(WeightFileError, match="no state dict"):
        find_state_dict({"epoch": 1, "weights_of": "nothing"})
    with pytest.raises(WeightFileError, match="no entry 'ema'"):
        find_state_dict(ckpt, key="ema")


def test_old_rebuild_functions_and_missing_byteorder(tmp_path: Path) -> None:
    hooks = Call(G("collections.OrderedDict"))
    pid = Pid(("storage", G("torch.FloatStorage"), "0", "cpu", 6))
    tree = {
        "v1": Call(G("torch._utils._rebuild_tensor"), pid, 1, (2, 2), (1, 2)),
        "p": Call(
            G("torch._utils._rebuild_parameter_with_state"),
            tensor("0", "FloatStorage", 6, 0, (3,), (2,)),
            True,
            hooks,
            {},
        ),
    }
    # no byteorder entry: written before torch recorded it, so little-endian
    weights = load_weights(write_zip(tmp_path / "w", pickled(tree), {"0": FLOATS}))
    np.testing.assert_array_equal(weights["v1"], [[1, 3], [2, 4]])
    np.testing.assert_array_equal(weights["p"], [0, 2, 4])


def test_big_endian_legacy_file(tmp_path: Path) -> None:
    tree = {
        "w": tensor("0", "FloatStorage", 6, 0, (2, 3), (3, 1)),
        "n": tensor("1", "LongStorage", 1, 0, (), ()),
    }
    storages = {
        "0": (6, np.arange(6, dtype=">f4").tobytes()),
        "1": (1, np.array(-5, ">i8").tobytes()),
    }
    weights = load_weights(write_legacy(tmp_path / "be.pt", pickled(tree), storages, ">"))
    np.testing.assert_array_equal(weights["w"], np.arange(6, dtype=np.float32).reshape(2, 3))
    assert weights["n"] == -5 and weights["n"].dtype == np.int64
    assert weights["w"].dtype == np.dtype("float32")  # native order


# --- hostile files: each names the global, and the payload never runs ------------------------


class Payload:
    """Unpickles to a shell command that creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.marker}",)


def test_zip_with_os_system_is_refused_and_not_run(tmp_path: Path) -> None:
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(Payload(control), protocol=2))  # proves the payload is live
    assert control.exists()
    marker = tmp_path / "marker"
    for protocol in (2, 4):  # GLOBAL, then STACK_GLOBAL
        data = pickle.dumps({"w": Payload(marker)}, protocol=protocol)
        path = write_zip(tmp_path / f"evil{protocol}.pt", data, {})
        with pytest.raises(UnsafeWeightFileError) as err:
            load_weights(path)
        message = str(err.value)
        assert str(path) in message and f"{os.system.__module__}.system" in message
        assert "only loads tensors and plain containers" in message
        assert "torch.save(model.state_dict(), path)" in message and "safetensors" in message
    assert not marker.exists()


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        (Call(G("os.system"), "touch {marker}"), "os.system"),
        (Call(G("builtins.eval"), "open('{marker}', 'w')"), "builtins.eval"),
        (Call(G("builtins.getattr"), G("collections.OrderedDict"), "fromkeys"), "builtins.getattr"),
        (Call(G("torch.FloatStorage"), 3), "a call of torch.FloatStorage"),
        (Build(G("torch._utils._rebuild_tensor_v2"), {"x": 1}), "setting the state of"),
        (Build(tensor("0", "FloatStorage", 6, 0, (6,), (1,)), {"x": 1}), "setting the state of"),
        (Pid("not a storage"), "persistent id"),
        (G("torch._utils._rebuild_tensor_v2"), "as a value"),
    ],
)
def test_legacy_stream_with_a_disallowed_construct(payload: Any, named: str, tmp_path: Path):
    marker = tmp_path / "marker"
    main = pickled({"w": payload}).replace(b"{marker}", str(marker).encode())
    path = write_legacy(tmp_path / "evil.pt", main, {})
    with pytest.raises(UnsafeWeightFileError, match=named) as err:
        load_weights(path)
    assert str(path) in str(err.value)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("data", "named"),
    [
        (pickle.dumps(argparse.Namespace(lr=0.1), protocol=2), "argparse.Namespace"),
        (b"\x80\x02(ios\nsystem\nX\x04\x00\x00\x00true.", "os.system"),
        (b"\x80\x02ccollections\nOrderedDict\n)\x81.", "opcode NEWOBJ"),
    ],
    ids=["argparse", "inst", "newobj"],
)
def test_zip_with_class_instances_is_refused(data: bytes, named: str, tmp_path: Path) -> None:
    with pytest.raises(UnsafeWeightFileError, match=named):
        load_weights(write_zip(tmp_path / "ckpt.pt", data, {}))


# --- damaged input: a WeightFileError that names the file and the problem ---------------------


def cut(fixture: str, keep: float) -> bytes:
    """The first ``keep`` fraction of a fixture, as a truncated download leaves it."""
    raw = (DATA / fixture).read_bytes()
    return raw[: int(len(raw) * keep)]


def safetensors(header: bytes, data: bytes = b"", length: int | None = None) -> bytes:
    """A safetensors file from its parts; ``length`` overrides the header length."""
    return struct.pack("<Q", len(header) if length is None else length) + header + data


def one_tensor(entry: str) -> bytes:
    """A safetensors file with one tensor ``w`` described by ``entry`` and 8 data bytes."""
    return safetensors(b'{"w": ' + entry.encode() + b"}", bytes(8))


DAMAGED = {
    "empty": (b"", "empty"),
    "unknown": (b"GIF89a\x00\x00\x00\x00", "not a PyTorch"),
    "zip_cut": (cut("flat_zip.pt", 0.6), "not a readable zip"),
    "legacy_cut": (cut("flat_legacy.pt", 0.9), "truncated"),
    "legacy_pickle_cut": (cut("flat_legacy.pt", 0.1), "truncated pickle"),
    "safetensors_cut": (cut("flat.safetensors", 0.8), "outside"),
    "bad_json": (safetensors(b"{not json}"), "not valid JSON"),
    "header_too_long": (safetensors(b"{}", length=10**6), "exceeds the file"),
    "offsets_out_of_range": (
        one_tensor('{"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}'),
        "outside",
    ),
    "offsets_wrong_size": (
        one_tensor('{"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}'),
        "needs 4",
    ),
    "unknown_dtype": (
        one_tensor('{"dtype": "F7", "shape": [2], "data_offsets": [0, 8]}'),
        "unknown dtype",
    ),
    "not_torch_pickle": (pickle.dumps([1, 2], protocol=2), "magic number"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_damaged_file(case: str, tmp_path: Path) -> None:
    raw, problem = DAMAGED[case]
    path = tmp_path / f"{case}.pt"
    path.write_bytes(raw)
    with pytest.raises(WeightFileError, match=problem) as err:
        load_weights(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize(
    ("tree", "storages", "extra", "problem"),
    [
        (tensor("0", "FloatStorage", 6, 0, (6,), (1,)), {"0": FLOATS[:8]}, {}, "fewer than"),
        (tensor("0", "FloatStorage", 6, 4, (3,), (1,)), {"0": FLOATS}, {}, "past the end"),
        (tensor("0", "FloatStorage", 6, 0, (6,), (1,)), {}, {}, "missing"),
        (tensor("0", "ComplexHalfStorage", 6, 0, (6,), (1,)), {}, {}, "torch.ComplexHalfStorage"),
        (
            tensor("0", "FloatStorage", 6, 0, (6,), (1,)),
            {"0": FLOATS},
            {"byteorder": b"mid"},
            "byte order",
        ),
    ],
)
def test_damaged_zip(tree: Any, storages: dict, extra: dict, problem: str, tmp_path: Path):
    path = write_zip(tmp_path / "w.pt", pickled({"w": tree}), storages, **extra)
    with pytest.raises(WeightFileError, match=problem) as err:
        load_weights(path)
    assert str(path) in str(err.value)


def test_damaged_legacy_storage_and_nesting(tmp_path: Path) -> None:
    main = pickled({"w": tensor("0", "FloatStorage", 6, 0, (6,), (1,))})
    path = write_legacy(tmp_path / "short.pt", main, {"0": (2, FLOATS[:8])})
    with pytest.raises(WeightFileError, match=f"{path}.*fewer than the 24"):
        load_weights(path)
    deep = write_zip(tmp_path / "deep.pt", b"\x80\x02" + b"]" * 50_000 + b"a" * 49_999 + b".", {})
    with pytest.raises(WeightFileError, match="nested too deeply"):
        load_torch_object(deep)


def test_zip_without_data_pkl_missing_file_and_tar(tmp_path: Path) -> None:
    npz = tmp_path / "arrays.npz"
    np.savez(npz, a=np.zeros(2))
    with pytest.raises(WeightFileError, match=f"{npz}.*data.pkl"):
        load_weights(npz)
    missing = tmp_path / "missing.pt"
    with pytest.raises(FileNotFoundError, match=str(missing)) as err:
        load_weights(missing)
    assert isinstance(err.value, WeightFileError)
    with pytest.raises(WeightFileError, match="directory"):
        load_weights(tmp_path)
    old = tmp_path / "old.tar"
    with tarfile.open(old, "w") as tar:
        tar.add(npz, arcname="pickle")
    with pytest.raises(WeightFileError, match=f"{old}.*does not support.*torch.save"):
        load_weights(old)


def test_damaged_entry_name_in_zip(tmp_path: Path) -> None:
    """A byte flipped inside a storage entry's name (flagged UTF-8) is a damaged file."""
    raw = bytearray((DATA / "flat_zip.pt").read_bytes())
    raw[raw.find(b"/data/0") + 6] = 0xFF
    bad = tmp_path / "bad.pt"
    bad.write_bytes(bytes(raw))
    with pytest.raises(WeightFileError, match=r"bad\.pt: damaged or unreadable"):
        load_torch_object(bad)
