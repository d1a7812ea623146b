"""The own-chunk copy of hypercube: an exact kernel copy under CUDA graph capture (a
captured memcpy node is slow), cudaMemcpyAsync otherwise. Runs on CPU tensors."""

import types

import pytest
import torch

from ncclbench.backends.torch_dist import TorchBackend, byte_copy


def _bytes(t):
    return bytes(t.contiguous().view(torch.uint8).tolist())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int8, torch.float16])
@pytest.mark.parametrize("count,offset", [(64, 0), (63, 1), (7, 3), (1, 0), (40, 2)])
def test_byte_copy_is_bit_exact_at_any_size_and_offset(dtype, count, offset):
    gen = torch.Generator().manual_seed(count * 31 + offset)
    raw = torch.randint(0, 256, ((count + offset) * torch.empty((), dtype=dtype).element_size(),),
                        dtype=torch.uint8, generator=gen)
    src = raw.view(dtype)[offset:offset + count]  # arbitrary bit patterns: NaN payloads, -0.0
    if dtype.is_floating_point:
        src[0] = -0.0
    dst_base = torch.zeros(count + offset + 1, dtype=dtype)
    dst = dst_base[offset + 1:offset + 1 + count]  # a different misalignment than src
    byte_copy(torch, dst, src)
    assert _bytes(dst) == _bytes(src)
    assert _bytes(dst_base[:offset + 1]) == bytes((offset + 1) * dst.element_size())  # nothing outside written


def test_byte_copy_picks_the_widest_integer_view(monkeypatch):
    seen = []
    real_add = torch.add

    def spy(a, b, out):
        seen.append(out.dtype)
        return real_add(a, b, out=out)

    monkeypatch.setattr(torch, "add", spy)
    byte_copy(torch, torch.empty(16, dtype=torch.float32), torch.ones(16))       # 64 B
    byte_copy(torch, torch.empty(3, dtype=torch.float32), torch.ones(3))         # 12 B
    byte_copy(torch, torch.empty(3, dtype=torch.float16), torch.ones(3, dtype=torch.float16))  # 6 B
    byte_copy(torch, torch.empty(5, dtype=torch.int8), torch.ones(5, dtype=torch.int8))        # 5 B
    assert seen == [torch.int64, torch.int32, torch.int16, torch.uint8]


@pytest.mark.parametrize("capturing", [True, False])
def test_backend_copy_uses_a_kernel_only_while_capturing(monkeypatch, capturing):
    calls = []
    fake_torch = types.SimpleNamespace(
        cuda=types.SimpleNamespace(is_current_stream_capturing=lambda: capturing),
        add=lambda a, b, out: calls.append("kernel") or torch.add(a, b, out=out),
        uint8=torch.uint8, int64=torch.int64, int32=torch.int32, int16=torch.int16)
    backend = TorchBackend.__new__(TorchBackend)
    backend.device, backend.torch = types.SimpleNamespace(type="cuda"), fake_torch
    src, dst = torch.arange(8, dtype=torch.float32), torch.zeros(8)
    backend._copy(dst, src)
    assert torch.equal(dst, src)
    assert calls == (["kernel"] if capturing else [])
