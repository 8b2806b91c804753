"""The emulated GPU's own checks (codegen/kernels/emu.h, through tests/kernel_emu.py) on small made-up kernels: shuffles
across a wave of 32 and of 64, the 32-lane groups of a wave of 64 going their own ways, and the errors
it reports instead of a hang or a wrong number: a shuffle or lp_sync some lanes never reach, a WMMA
operand whose lanes 16..31 do not repeat lanes 0..15, and what it does not emulate."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from llmplan.codegen.kernel import Kernel, Launch

from codegen_checks import needs_host_emulator
from kernel_emu import Emulator

pytestmark = needs_host_emulator


def kernel(name: str, body: str, block: int = 64, source: str = "common.cuh") -> Kernel:
    return Kernel(name, "test", source, f"LP_KERNEL void {name}(int* out, int n) {{ {body} }}", block)


KERNELS = [
    # every lane: the sum of lane ids of its wave, then of the block
    kernel("wave_sum", "__shared__ int s[8]; out[lp_tid()] = lp_wave_sum(lp_lane()) + lp_block_sum(1, s);"),
    # 32-lane groups of a wave take 1 + group rounds of shuffles (lp_pack_row's groups on a wave of 64),
    # then shuffle across the groups, after lp_sync (n = 1) or not
    kernel("group_rounds", "int v = lp_tid(); for (int r = 0; r <= lp_tid() / 32; ++r) v = lp_shfl_xor(v, 1); "
                           "if (n) lp_sync(); out[lp_tid()] = v + lp_wave_sum(1);"),
    kernel("divergent_shuffle", "if (lp_lane() < 16) out[lp_tid()] = lp_shfl_xor(1, 1);"),
    kernel("sync_after_return", "if (lp_tid() >= n) return; lp_sync(); out[lp_tid()] = 1;"),
    kernel("half_wave", "out[lp_tid()] = 0;", block=16),
]
MMA = [kernel("wmma_unrepeated", "lp_v4i a = {lp_lane(), 0, 0, 0}, b = {1, 1, 1, 1}; lp_v8i c = {}; "
                                 "c = lp_wmma_i8(a, b, c); out[lp_tid()] = c[0];", 32, "mma.cuh")]


@functools.cache
def emulator(wave: int, mode: str = "plain") -> Emulator:
    return Emulator(MMA if mode == "wmma" else KERNELS, wave, mode)


def run(wave: int, name: str, n: int = 0, mode: str = "plain", smem: int = 0) -> np.ndarray:
    e = emulator(wave, mode)
    out = np.full(64, -1, np.int32)
    e.launch(Launch(e.kernels[name], (1,), [{"buf": 0}, {"i32": n}], smem), lambda ref: out, {})
    return out


@pytest.mark.parametrize("wave", [32, 64])
def test_shuffles_and_block_sums(wave):
    lanes = np.arange(64) % wave
    want = np.repeat([lanes[:wave].sum()] * (64 // wave), wave) + 64
    np.testing.assert_array_equal(run(wave, "wave_sum"), want)


def test_groups_of_a_wave_of_64_may_diverge():
    got = run(64, "group_rounds", n=1)
    want = np.arange(64)
    want[:32] ^= 1  # one round for the first group, two (back again) for the second
    np.testing.assert_array_equal(got, want + 64)
    with pytest.raises(RuntimeError, match="group_rounds: shuffles out of step"):
        run(64, "group_rounds", n=0)


@pytest.mark.parametrize("wave", [32, 64])
def test_a_shuffle_some_lanes_skip_is_an_error(wave):
    with pytest.raises(RuntimeError, match="divergent_shuffle: deadlock"):
        run(wave, "divergent_shuffle")


def test_lp_sync_after_some_lanes_returned_is_an_error():
    assert (run(32, "sync_after_return", n=64) == 1).all()
    with pytest.raises(RuntimeError, match="sync_after_return: deadlock"):
        run(32, "sync_after_return", n=40)


def test_wmma_operands_must_repeat_in_lanes_16_to_31():
    with pytest.raises(RuntimeError, match="wmma_unrepeated: wmma: lanes 16..31 do not repeat lanes 0..15"):
        run(32, "wmma_unrepeated", mode="wmma")


def test_what_is_not_emulated():
    with pytest.raises(RuntimeError, match="dynamic shared memory"):
        run(32, "wave_sum", smem=1024)
    with pytest.raises(RuntimeError, match="half_wave: block is not a whole number of waves"):
        run(32, "half_wave")
