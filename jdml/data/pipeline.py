"""grain input pipelines: training batches indexed by global step, and evaluation batches.

A training batch is a pure function of (seed, step): the sampler draws its indices from
``default_rng((seed, step))`` and row i's augmentation from its own generator (``row_rng``), so
that any process can build any rows of the global batch (multi-host input) and they are the rows
one process would build. The grain dataset is therefore indexed by step, and resuming at step s
is ``MapDataset.range(s, total)``: the iterator state that has to be checkpointed is the step
itself.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterator
from typing import Any

import grain
import numpy as np
from absl import flags

from jdml.data.arrays import ImageSet
from jdml.data.augment import PER_ROW_DRAWS, Augmentation
from jdml.data.benchmarks import FileList
from jdml.data.benchmarks.decode_cache import open_cache
from jdml.data.device_pixels import HostViews
from jdml.platform import platform


def row_rng(seed: int, step: int, view: int, member: int, row: int) -> np.random.Generator:
    """The generator of one augmented image: row ``row`` of the global batch of ``step``, view
    ``view`` (1 and 2: DaNCE's two views; ``2 + s``: stream s), as member ``member`` sees it.

    The last entry is ``row + 1`` because NumPy's seed sequences ignore trailing zeros: no row's
    tuple can equal a shorter one (the sampler's ``(seed, step)``, a stream's draw
    ``(seed, step, 2 + s)``).
    """
    return np.random.default_rng((seed, step, view, member, row + 1))


# NumPy's SeedSequence (M. O'Neill's seed_seq_fe with a pool of 4 words) and PCG64 (a 128-bit
# LCG with the XSL-RR output), written out over arrays: a batch's per-row generators then cost a
# few dozen array operations instead of a generator object per row. ``row_uniforms`` equals
# drawing from ``row_rng`` bit for bit (tests compare them over many seeds).
_MASK32, _MASK64 = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_MULT_L, _MIX_MULT_R, _POOL_SIZE = 0xCA01F9DD, 0x4973F715, 4
_PCG_MULT = (2549297995355413924 << 64) | 4865540595714422341


def _uint32_words(value: int) -> list[int]:
    """A non-negative int as SeedSequence reads it: 32-bit words, least significant first."""
    words = [value & _MASK32]
    value >>= 32
    while value:
        words.append(value & _MASK32)
        value >>= 32
    return words


def _hash_consts(start: int, mult: int, count: int) -> list[int]:
    """The successive hash constants of SeedSequence (``h *= mult`` before each use)."""
    out = []
    for _ in range(count):
        start = start * mult & _MASK32
        out.append(start)
    return out


def _shift_xor(value: Any) -> Any:
    return value ^ (value >> 16)


def _shared_pool(prefix: list[int]) -> tuple[list[int], int]:
    """SeedSequence's pool after mixing the entropy words ``prefix`` (at least 4), which every
    row shares, and the hash constant reached; in Python ints."""
    hash_const = _INIT_A

    def hashmix(value: int) -> int:
        nonlocal hash_const
        value ^= hash_const
        hash_const = hash_const * _MULT_A & _MASK32
        return _shift_xor(value * hash_const & _MASK32)

    def mix(x: int, y: int) -> int:
        return _shift_xor((_MIX_MULT_L * x - _MIX_MULT_R * y) & _MASK32)

    pool = [hashmix(prefix[i]) for i in range(_POOL_SIZE)]
    for src in range(_POOL_SIZE):
        for dst in range(_POOL_SIZE):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for word in prefix[_POOL_SIZE:]:
        for dst in range(_POOL_SIZE):
            pool[dst] = mix(pool[dst], hashmix(word))
    return pool, hash_const


def _u32(values: list[int]) -> np.ndarray:
    return np.array(values, np.uint32)[:, None]


def _u64(values: list[int]) -> np.ndarray:
    return np.array(values, np.uint64)[:, None]


def _mul128(
    a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """128-bit products modulo 2^128 of (high, low) uint64 pairs (broadcasting)."""
    m32, s32 = np.uint64(_MASK32), np.uint64(32)
    (ah, al), (bh, bl) = a, b
    a0, a1, b0, b1 = al & m32, al >> s32, bl & m32, bl >> s32
    low, cross1, cross2 = a0 * b0, a0 * b1, a1 * b0
    middle = (low >> s32) + (cross1 & m32) + (cross2 & m32)
    carry = a1 * b1 + (cross1 >> s32) + (cross2 >> s32) + (middle >> s32)
    return carry + al * bh + ah * bl, al * bl


def _add128(
    a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """128-bit sums modulo 2^128 of (high, low) uint64 pairs (broadcasting)."""
    low = a[1] + b[1]
    return a[0] + b[0] + (low < a[1]).astype(np.uint64), low


@functools.lru_cache(maxsize=8)
def _pcg_jumps(count: int) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(A_k, C_k) for k = 2..count + 1 as (count, 1) (high, low) arrays: k LCG steps from t are
    ``A_k t + C_k inc`` with ``A_k = M^k`` and ``C_k = 1 + M + ... + M^(k-1)``."""
    a, c, jumps = _PCG_MULT, 1, []
    for _ in range(count):
        c = (c + a) & (1 << 128) - 1
        a = a * _PCG_MULT & (1 << 128) - 1
        jumps.append((a, c))
    split = [(x >> 64, x & _MASK64) for pair in jumps for x in pair]
    a_k = (_u64([h for h, _ in split[0::2]]), _u64([lo for _, lo in split[0::2]]))
    c_k = (_u64([h for h, _ in split[1::2]]), _u64([lo for _, lo in split[1::2]]))
    return a_k, c_k


def row_uniforms(
    seed: int, step: int, view: int, member: int, rows: np.ndarray, count: int
) -> np.ndarray:
    """The first ``count`` doubles in [0, 1) of each row's generator: row k of the result equals
    ``row_rng(seed, step, view, member, rows[k]).random(count)``, bit for bit.

    NumPy's ``rng.uniform(low, high)`` is ``low + (high - low) * rng.random()``, so augmentations
    that draw only uniforms take their draws from here (:data:`jdml.data.augment.PER_ROW_DRAWS`).

    Args:
      seed: the run seed; ``step``, ``view`` and ``member`` as for :func:`row_rng`.
      rows: the rows of the global batch (non-negative ints).
      count: doubles drawn per row.

    Returns:
      float64 (len(rows), count).
    """
    rows = np.asarray(rows, np.int64).reshape(-1)
    if len(rows) == 0 or count == 0:
        return np.zeros((len(rows), count))
    if rows.min() < 0 or rows.max() + 1 > _MASK32:  # not one 32-bit word: each row's generator
        return np.stack([row_rng(seed, step, view, member, int(r)).random(count) for r in rows])
    # SeedSequence: the shared words (seed, step, view, member), then each row's last word.
    prefix = [w for v in (seed, step, view, member) for w in _uint32_words(int(v))]
    pool, hash_const = _shared_pool(prefix)
    consts = [hash_const, *_hash_consts(hash_const, _MULT_A, _POOL_SIZE)]  # xor, multiply
    last = (rows + 1).astype(np.uint32)[None]
    hashed = _shift_xor((last ^ _u32(consts[:-1])) * _u32(consts[1:]))
    pool_rows = _shift_xor(np.uint32(_MIX_MULT_L) * _u32(pool) - np.uint32(_MIX_MULT_R) * hashed)
    # generate_state(4, uint64): 8 words from the pool cycled, paired little-endian.
    consts = [_INIT_B, *_hash_consts(_INIT_B, _MULT_B, 8)]
    words = np.tile(pool_rows, (2, 1)) ^ _u32(consts[:-1])
    words = _shift_xor(words * _u32(consts[1:])).astype(np.uint64)
    state = words[0::2] | (words[1::2] << np.uint64(32))  # initstate high, low, initseq high, low
    # PCG64 seeding (inc = initseq << 1 | 1, t = inc + initstate), then ``count`` outputs.
    one = np.uint64(1)
    inc = ((state[2] << one) | (state[3] >> np.uint64(63)), (state[3] << one) | one)
    a_k, c_k = _pcg_jumps(count)
    high, low = _add128(_mul128(a_k, _add128(inc, (state[0], state[1]))), _mul128(c_k, inc))
    rotation = high >> np.uint64(58)
    mixed = high ^ low
    value = (mixed >> rotation) | (mixed << ((np.uint64(64) - rotation) & np.uint64(63)))
    return ((value >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)).T


@dataclasses.dataclass(frozen=True)
class TrainBatch:
    """grain map function: step -> {'images', 'labels', 'indices'} for that step.

    With ``views=2`` the batch also holds ``images_b``: the same images under an independent
    augmentation draw, the second view DaNCE's keys see. With ``streams=s``, streams 1..s-1 add
    ``images_<i>`` / ``labels_<i>``: a batch of the same size drawn uniformly without replacement
    (``default_rng((seed, step, 2 + i))``). With ``members=(m1, m2, ...)`` (a DM2 cohort with view
    diversity: the members whose views this process builds) the views get a leading member axis:
    member ``m`` sees its own augmentation of the same images; member 0's is the plain run's.
    Every image has its own generator (``row_rng``).

    With ``views_on_device`` (``data.views=device``) no pixels are made here: each view is its
    parameters (``<view>:<field>`` entries, drawn with the same generators, so they are the
    parameters of the host path's views) and the photos are their indices (``photos``, a
    stream's ``photos_<s>``) into the device-resident set, or their canvases (``canvas``,
    ``transposed``) when the set is streamed; the step makes the views
    (``jdml.data.device_pixels.make_views``).

    With ``rows=(start, stop)`` (multi-host input: the rows of the global batch on this
    process's devices) only those rows are loaded and augmented; they equal the same rows of
    the whole batch.
    """

    data: ImageSet
    sampler: object  # jdml.samplers.base sampler with .batch(step)
    augment: Augmentation
    seed: int
    views: int = 1
    streams: int = 1
    members: tuple[int, ...] = ()
    rows: tuple[int, int] | None = None
    views_on_device: HostViews | None = None

    def _augment(self, images: np.ndarray, step: int, view: int, member: int) -> np.ndarray:
        """Augments each image with its own generator (``row_rng``); an augmentation of
        :data:`PER_ROW_DRAWS` gets every row's draws at once and augments the batch in one
        call, with the same values."""
        start = self.rows[0] if self.rows else 0
        per_row = PER_ROW_DRAWS.get(self.augment) if isinstance(images, np.ndarray) else None
        if per_row is not None:
            count, apply = per_row
            rows = np.arange(start, start + len(images))
            return apply(images, row_uniforms(self.seed, step, view, member, rows, count))
        return np.concatenate(
            [
                self.augment(images[i : i + 1], row_rng(self.seed, step, view, member, start + i))
                for i in range(len(images))
            ]
        )

    def _device_view(self, idx: np.ndarray, step: int, view: int, key: str) -> dict:
        """The parameters of view ``view`` of the photos ``idx`` as ``<key>:<field>`` arrays
        (with a leading member axis for the members' own views)."""
        start = self.rows[0] if self.rows else 0

        def arrays(member: int) -> dict[str, np.ndarray]:
            rngs = [row_rng(self.seed, step, view, member, start + i) for i in range(len(idx))]
            return self.views_on_device.arrays(idx, rngs)

        if not self.members:
            out = arrays(0)
        else:
            each = [arrays(m) for m in self.members]
            out = {f: np.stack([a[f] for a in each]) for f in each[0]}
        return {f"{key}:{f}": v for f, v in out.items()}

    def _device_batch(self, step: int, batch: np.ndarray) -> dict[str, np.ndarray]:
        """The batch of ``step`` with its views as parameters (``views_on_device``)."""
        host = self.views_on_device
        idx = self._rows(batch)
        out = {
            "labels": self.data.labels[idx].astype(np.int32),
            "indices": idx.astype(np.int32),
            **host.photos(self.data, idx),
            **self._device_view(idx, step, 1, "images"),
        }
        if self.views == 2:
            out.update(self._device_view(idx, step, 2, "images_b"))
        for stream in range(1, self.streams):
            rng = np.random.default_rng((self.seed, step, 2 + stream))
            idx = self._rows(rng.choice(len(self.data), len(batch), replace=False))
            photos = host.photos(self.data, idx)
            out.update({f"{k}_{stream}": v for k, v in photos.items()})
            members = dataclasses.replace(self, members=())
            out.update(members._device_view(idx, step, 2 + stream, f"images_{stream}"))
            out[f"labels_{stream}"] = self.data.labels[idx].astype(np.int32)
        return out

    def _view(self, images: np.ndarray, step: int, view: int) -> np.ndarray:
        if not self.members:
            return self._augment(images, step, view, 0)
        return np.stack([self._augment(images, step, view, m) for m in self.members])

    def _rows(self, idx: np.ndarray) -> np.ndarray:
        return idx[slice(*self.rows)] if self.rows else idx

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        step = int(step)
        batch = self.sampler.batch(step)  # the global batch's indices
        if self.views_on_device is not None:
            return self._device_batch(step, batch)
        idx = self._rows(batch)
        images = self.data.load(idx)
        out = {
            "images": self._view(images, step, 1),
            "labels": self.data.labels[idx].astype(np.int32),
            "indices": idx.astype(np.int32),
        }
        if self.views == 2:
            out["images_b"] = self._view(images, step, 2)
        for stream in range(1, self.streams):
            # A further stream: images in random order (the Sharing Matters shared stream).
            rng = np.random.default_rng((self.seed, step, 2 + stream))
            idx = self._rows(rng.choice(len(self.data), len(batch), replace=False))
            out[f"images_{stream}"] = self._augment(self.data.load(idx), step, 2 + stream, 0)
            out[f"labels_{stream}"] = self.data.labels[idx].astype(np.int32)
        return out


#: The value of ``data.num_threads`` / ``data.num_workers`` that sizes the pipeline itself.
AUTO = -1
#: Cores an automatically sized pipeline leaves to the main process: its Python thread feeds the
#: device (host-to-device copies, dispatch, metrics) and the runtime's threads run beside it.
RESERVED_CORES = 2
#: Reader threads of each worker process for photos decoded per batch: Pillow decodes and
#: resizes without the GIL, so a second thread keeps a process busy while the first holds it
#: (measured on 16 cores: 8 processes of 2 threads 8,585 img/s, 8 threads in one process 2,016).
THREADS_PER_WORKER = 2


@dataclasses.dataclass(frozen=True)
class PipelineSizes:
    """The input pipeline's reader threads (of each worker process, if any) and worker
    processes, and how they were chosen (for the log)."""

    threads: int
    workers: int
    reason: str

    def describe(self) -> str:
        """One line for the log, e.g. "14 threads in this process (auto: ...)"."""
        if self.workers:
            where = f"{self.workers} worker processes of {self.threads} threads"
        else:
            where = f"{self.threads} thread{'s' * (self.threads != 1)} in this process"
        return f"{where} ({self.reason})"


def host_cores() -> int:
    """The cores this process may run on: its CPU affinity where the OS reports one (a
    container's or a scheduler's limit), else every core of the machine."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def resolve_pipeline_sizes(
    num_threads: int, num_workers: int, *, backend: str, cores: int, decodes: bool
) -> PipelineSizes:
    """The pipeline's sizes: ``data.num_threads`` and ``data.num_workers``, each :data:`AUTO`
    (-1) value derived from the host.

    On the CPU backend the cores also run the train step: 2 threads and no worker process, as
    before sizes were automatic. With an accelerator the pipeline gets every core but
    :data:`RESERVED_CORES`, and at least 2 (one pipeline per process; under ``jax.distributed``
    jdml runs one process per host, so each host's pipeline gets that host's cores):

    * photos decoded per batch (``decodes``): threads of one process scaled poorly on them
      (measured on 16 cores: 8 threads 2,016 img/s, 8 processes of 2 threads 8,585), so worker
      processes of :data:`THREADS_PER_WORKER` threads fill the cores, provided there are at
      least two (a single worker gains nothing over threads but its start-up, 3-4 s at every
      epoch, since each epoch starts its own iterator);
    * images in memory (glyphs, emoji, npz, folder) and photos read from the decode cache:
      threads in this process. Their augmentation runs mostly without the GIL (whole-batch
      NumPy for arrays, Pillow's resize for cached photos), and worker processes would cost
      their start-up at every epoch (longer than a whole glyph epoch on a GPU).

    A value set explicitly always wins; the other one is then derived around it.

    Args:
      num_threads: ``data.num_threads`` (-1 or at least 1).
      num_workers: ``data.num_workers`` (-1 or at least 0).
      backend: :func:`jdml.platform.platform` ("cpu", "gpu", "tpu", ...).
      cores: the host cores this process may use (:func:`host_cores`).
      decodes: whether the training split decodes an encoded image per photo drawn.

    Returns:
      The sizes and the reason, for the log.
    """
    auto_threads, auto_workers = num_threads == AUTO, num_workers == AUTO
    if not (auto_threads or auto_workers):
        return PipelineSizes(num_threads, num_workers, "as set")
    if backend == "cpu":
        reason = "auto: the CPU backend, whose cores also run the step"
        return PipelineSizes(
            2 if auto_threads else num_threads, 0 if auto_workers else num_workers, reason
        )
    usable = max(2, cores - RESERVED_CORES)
    data = "photos decoded per batch" if decodes else "images in memory or decode-cached"
    reason = f"auto: {backend} backend, {cores} host cores, {usable} for the pipeline; {data}"
    if auto_workers:
        per_worker = THREADS_PER_WORKER if auto_threads else num_threads
        workers = usable // per_worker if decodes else 0
        num_workers = workers if workers >= 2 else 0
    if auto_threads:
        if num_workers:
            num_threads = THREADS_PER_WORKER if decodes else max(1, usable // num_workers)
        else:
            num_threads = usable
    return PipelineSizes(num_threads, num_workers, reason)


def input_pipeline(
    make_batch: TrainBatch, data_cfg: Any, *, backend: str | None = None
) -> tuple[TrainBatch, PipelineSizes]:
    """The training batches as the ``data`` config builds them, and the pipeline's sizes.

    With ``data.decode_cache`` a training split of photo files is read from its decode cache
    (:mod:`jdml.data.benchmarks.decode_cache`, built at the first call of a run, then reused);
    the sizes are :func:`resolve_pipeline_sizes` of ``data.num_threads`` and
    ``data.num_workers`` for this host and ``backend`` (default: JAX's).
    """
    data = training_photos(make_batch.data, data_cfg)
    if data is not make_batch.data:
        make_batch = dataclasses.replace(make_batch, data=data)
    sizes = resolve_pipeline_sizes(
        data_cfg.num_threads,
        data_cfg.num_workers,
        backend=backend or platform(),
        cores=host_cores(),
        decodes=getattr(data, "decodes", False),
    )
    return make_batch, sizes


def training_photos(data: Any, data_cfg: Any) -> Any:
    """The training split as the pipeline reads it: from its decode cache with
    ``data.decode_cache`` (photo files only; short side ``data.cache_size``, 0 for
    ``data.resize``), else ``data`` itself."""
    if data_cfg.decode_cache and isinstance(data, FileList):
        return _decode_cached(data, data_cfg.cache_size or data_cfg.resize, data_cfg.cache_dir)
    return data


#: The decode caches opened in this process, by the file list they cache (one run reads its
#: training split's cache at every epoch).
_OPENED: dict[tuple[int, int, str], tuple[FileList, Any]] = {}


def _decode_cached(files: FileList, resize: int, folder: str) -> Any:
    key = (id(files), resize, folder)
    if key not in _OPENED or _OPENED[key][0] is not files:
        _OPENED[key] = (files, open_cache(files, resize, folder, threads=host_cores()))
    return _OPENED[key][1]


def train_batches(
    make_batch: TrainBatch,
    *,
    start_step: int,
    total_steps: int,
    num_threads: int,
    prefetch: int,
    num_workers: int = 0,
) -> Iterator[dict[str, np.ndarray]]:
    """Iterates the batches of steps ``start_step .. total_steps - 1``, in step order.

    Args:
      make_batch: the step -> batch function.
      start_step: the first step (resuming starts here: the iterator state is the step).
      total_steps: one past the last step.
      num_threads: reader threads (of each worker process, with ``num_workers``).
      prefetch: batches prepared ahead (per worker process, with ``num_workers``); at least
        one per reader thread.
      num_workers: worker processes that build batches (grain's ``mp_prefetch``), for decoding
        and augmentation heavier than threads can carry; 0 builds them in this process. The
        batches are the same either way: each is a function of its step alone. Either size
        :data:`AUTO` (-1) is sized for this host and JAX's backend
        (:func:`resolve_pipeline_sizes`).
    """
    if AUTO in (num_threads, num_workers):
        sizes = resolve_pipeline_sizes(
            num_threads,
            num_workers,
            backend=platform(),
            cores=host_cores(),
            decodes=getattr(make_batch.data, "decodes", False),
        )
        num_threads, num_workers = sizes.threads, sizes.workers
    ds = grain.MapDataset.range(start_step, total_steps).map(make_batch)
    # grain reads at most ``prefetch_buffer_size`` batches at once: the buffer holds at least
    # one batch per thread, or threads beyond ``prefetch`` idle (on an H200 host, 14 threads with
    # a buffer of 4 built 27,924 glyph img/s, the rate of 4 threads).
    read_ahead = max(1, prefetch, num_threads)
    opts = grain.ReadOptions(num_threads=max(1, num_threads), prefetch_buffer_size=read_ahead)
    batches = ds.to_iter_dataset(opts)
    if num_workers > 0:
        if not flags.FLAGS.is_parsed():  # grain's workers read its absl flags (their defaults
            flags.FLAGS.mark_as_parsed()  # when jdml is used as a library, e.g. in a notebook)
        options = grain.MultiprocessingOptions(
            num_workers=num_workers, per_worker_buffer_size=max(1, prefetch)
        )
        batches = batches.mp_prefetch(options)
    return iter(batches)


def eval_batches(data: ImageSet, batch_size: int) -> Iterator[tuple[np.ndarray, int]]:
    """Yields fixed-shape (batch_size, H, W, C) float32 batches in [0, 1] and their valid counts.

    The images are ``data.eval_images`` (the evaluation transform of photos). The last batch is
    padded by repeating its final image so that the embedding function compiles once; callers
    drop the padded rows using the count.
    """
    n = len(data)
    for start in range(0, n, batch_size):
        index = np.arange(start, min(start + batch_size, n))
        valid = len(index)
        index = np.concatenate([index, np.full(batch_size - valid, index[-1])])
        yield data.eval_images(index), valid
