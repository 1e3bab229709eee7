"""The achieved-throughput helpers of the benchmarks (jdml/throughput.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from jdml import throughput


def test_compiled_flops_counts_a_matmul() -> None:
    a = jnp.ones((32, 48), jnp.float32)
    b = jnp.ones((48, 16), jnp.float32)
    flops = throughput.compiled_flops(jax.jit(jnp.matmul), a, b)
    assert flops == pytest.approx(2 * 32 * 48 * 16)


def test_device_peak_uses_the_data_sheet_for_known_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Device:
        device_kind = "NVIDIA A100-SXM4-80GB"

    monkeypatch.setattr(jax, "devices", lambda: [Device()])
    assert throughput.device_peak("bfloat16")[0] == 312.0
    assert throughput.device_peak("float32")[0] == 19.5
    Device.device_kind = "TPU v4"
    assert throughput.device_peak("float32")[0] == 275.0  # bf16 passes only


def test_device_peak_is_measured_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(throughput, "measured_matmul_tflops", lambda dtype: 0.25)
    peak, source = throughput.device_peak("float32")
    assert peak == 0.25 and "measured" in source
    line = throughput.throughput_line("step", 1e9, 0.01, "float32")
    assert "0.100 TFLOP/s" in line and "40.0% of 0.250" in line
    assert "no flop count" in throughput.throughput_line("step", None, 0.01, "float32")


def test_alternating_rounds_interleaves_and_waits_for_results() -> None:
    order: list[str] = []

    def contender(name: str):
        def call():
            order.append(name)
            return jnp.ones(3) * len(order)

        return call

    timings = throughput.alternating_rounds(
        {"a": contender("a"), "b": contender("b")}, repeats=3, calls=2, warmup=2
    )
    assert order == ["a", "a", "b", "b"] + ["a", "a", "b", "b"] * 3
    assert list(timings) == ["a", "b"]
    for timing in timings.values():
        assert len(timing.rounds) == 3 and all(t >= 0 for t in timing.rounds)
        assert timing.best <= timing.median and timing.first >= 0
    assert float(timings["b"].result[0]) == len(order)  # the last call's result
    with pytest.raises(ValueError, match="at least 1"):
        throughput.alternating_rounds({"a": contender("a")}, repeats=0)


def test_alternating_rounds_settles_untimed_and_collects_garbage_untimed() -> None:
    """``settle`` untimed calls come right before each contender's timed calls in every round;
    the garbage collector is off while a contender is timed and on again afterwards."""
    import gc

    log: list[tuple[str, bool]] = []

    def contender(name: str):
        def call():
            log.append((name, gc.isenabled()))
            return jnp.ones(2)

        return call

    assert gc.isenabled()
    timings = throughput.alternating_rounds(
        {"a": contender("a"), "b": contender("b")}, repeats=2, calls=1, settle=2
    )
    names = [name for name, _ in log]
    assert names == ["a", "b"] + ["a"] * 3 + ["b"] * 3 + ["a"] * 3 + ["b"] * 3
    assert all(not enabled for _, enabled in log[2:])  # the rounds: collector off
    assert gc.isenabled()
    assert all(len(timing.rounds) == 2 for timing in timings.values())
