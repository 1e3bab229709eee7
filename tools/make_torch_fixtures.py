"""Writes the PyTorch and safetensors fixtures of tests/models/test_torch_io.py with real torch.

The fixtures in ``tests/golden/torch_io/`` are small weight files saved by ``torch.save`` (zip and
legacy formats) and ``safetensors.torch.save_file``, and ``expected.npz`` holds what torch itself
reports for every tensor (``.numpy()``). numpy has no bfloat16 or float8, so those tensors are
stored there as float32 (exact for both) and listed in the ``standin_dtypes`` entry as
(key, true dtype) rows. torch is not a jdml dependency; run this in a separate environment:

  python3 -m venv /tmp/torchenv
  /tmp/torchenv/bin/pip install torch==2.13.0 numpy safetensors
  /tmp/torchenv/bin/python tools/make_torch_fixtures.py

The files are fully determined by the seed and the torch version, so rerunning with torch 2.13.0
rewrites the same tensors.
"""

from __future__ import annotations

import io
import pickle
import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "torch_io"
STANDINS = (torch.bfloat16, torch.float8_e4m3fn)


def flat_state_dict() -> dict[str, torch.Tensor]:
    """Every dtype the reader handles, plus views: transposed, strided, offset, shared storage."""
    grid = torch.arange(24, dtype=torch.float32).reshape(4, 6) * 0.5 - 3.0
    shared = torch.randn(10)
    return {
        "f32": torch.randn(3, 4),
        "f64": torch.randn(2, 3, dtype=torch.float64),
        "f16": torch.randn(5).half(),
        "bf16": torch.randn(2, 3).to(torch.bfloat16),
        "f8": torch.randn(4).to(torch.float8_e4m3fn),  # torch writes it with _rebuild_tensor_v3
        "i64": torch.arange(-3, 3, dtype=torch.int64),
        "i32": torch.tensor([-(2**31), 0, 2**31 - 1], dtype=torch.int32),
        "i16": torch.tensor([-32768, 7, 32767], dtype=torch.int16),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 128, 255], dtype=torch.uint8),
        "u16": torch.tensor([0, 1, 65535], dtype=torch.uint16),  # also _rebuild_tensor_v3
        "bool": torch.tensor([[True, False], [False, True]]),
        "transposed": grid.t(),
        "column": grid[:, 2],
        "narrowed": shared.narrow(0, 3, 4),
        "shared_a": shared[:5],
        "shared_b": shared[5:],
        "param": nn.Parameter(torch.randn(2, 2)),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "num_batches_tracked": torch.tensor(7),
    }


def small_net() -> nn.Sequential:
    """A convolution, batch norm and linear layer, with running statistics from two batches."""
    net = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()
    )
    net.append(nn.Linear(4, 2))
    for _ in range(2):
        net(torch.randn(2, 3, 5, 5))
    return net


def as_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    return t.float().numpy() if t.dtype in STANDINS else t.numpy()


class _StorageDtypes(pickle.Unpickler):
    """Reads our own data.pkl to learn each storage key's dtype (trusted input only)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.dtypes: dict[str, torch.dtype] = {}

    def find_class(self, module: str, name: str) -> object:
        if module == "torch._utils":
            return lambda *args: self._note(name, args)
        return super().find_class(module, name)

    def persistent_load(self, pid: tuple) -> tuple:
        return pid

    def _note(self, name: str, args: tuple) -> object:
        if name.startswith("_rebuild_parameter"):
            return args[0]
        pid = args[0]
        with warnings.catch_warnings():  # a typed storage class's dtype is deprecated API
            warnings.simplefilter("ignore")
            self.dtypes[pid[2]] = args[6] if name == "_rebuild_tensor_v3" else pid[1].dtype
        return None


def write_big_endian(src: Path, dst: Path) -> None:
    """A copy of a zip checkpoint as a big-endian machine writes it, in another top folder."""
    with zipfile.ZipFile(src) as archive:
        top = next(n for n in archive.namelist() if n.endswith("/data.pkl"))[: -len("data.pkl")]
        reader = _StorageDtypes(archive.read(f"{top}data.pkl"))
        reader.load()
        with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as out:
            for info in archive.infolist():
                data, rest = archive.read(info), info.filename[len(top) :]
                if rest == "byteorder":
                    data = b"big"
                elif rest.startswith("data/"):
                    dtype = reader.dtypes[rest[len("data/") :]]
                    unit = torch.empty(0, dtype=dtype).element_size()
                    unit //= 2 if dtype.is_complex else 1
                    data = np.frombuffer(data, f"u{unit}").byteswap().tobytes()
                out.writestr(f"bigendian/{rest}", data)


def main() -> None:
    """Writes every fixture and expected.npz into OUT."""
    torch.manual_seed(0)
    OUT.mkdir(parents=True, exist_ok=True)
    flat = flat_state_dict()
    module = small_net().state_dict()
    wrapped = nn.DataParallel(small_net())  # names its weights "module.<name>"
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9)
    wrapped(torch.randn(2, 3, 5, 5)).sum().backward()
    optimizer.step()
    nested = {
        "state_dict": wrapped.state_dict(),
        "epoch": 3,
        "optimizer": optimizer.state_dict(),
        "best_acc": 0.875,
        "arch": "tiny-convnet",
        "flags": (True, None, [1, 2]),
    }
    for name, obj in (("flat", flat), ("module", module), ("nested", nested)):
        torch.save(obj, OUT / f"{name}_zip.pt")
        torch.save(obj, OUT / f"{name}_legacy.pt", _use_new_zipfile_serialization=False)
    save_file(
        {k: v.detach().contiguous().clone() for k, v in flat.items()}, OUT / "flat.safetensors"
    )
    (OUT / "flat.safetensors").chmod(0o644)  # it is created private; it is committed
    write_big_endian(OUT / "flat_zip.pt", OUT / "flat_zip_bigendian.pt")

    expected = {f"flat/{k}": as_numpy(v) for k, v in flat.items()}
    expected |= {f"module/{k}": as_numpy(v) for k, v in module.items()}
    expected |= {f"nested/{k}": as_numpy(v) for k, v in wrapped.module.state_dict().items()}
    for index, state in optimizer.state_dict()["state"].items():
        expected[f"nested_momentum/{index}"] = as_numpy(state["momentum_buffer"])
    expected["standin_dtypes"] = np.array(
        [
            [f"flat/{k}", str(v.dtype).removeprefix("torch.")]
            for k, v in flat.items()
            if v.dtype in STANDINS
        ]
    )
    np.savez(OUT / "expected.npz", **expected)
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"wrote {len(list(OUT.iterdir()))} files, {total} bytes, to {OUT}")


if __name__ == "__main__":
    main()
