"""TensorFlow's "SAME" padding, shared by the convolutions of :mod:`jdml.nn`."""

from __future__ import annotations


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int, int]:
    """TensorFlow "SAME" padding of one spatial axis: (output size, pad before, pad after);
    the odd pixel of an uneven total goes after, as ``lax``'s ``"SAME"``."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return out, total // 2, total - total // 2
