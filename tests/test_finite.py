import pytest
import torch

from trtllm_medusa_ports.files.finite import all_finite, count_non_finite


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_all_finite_matches_isfinite(dtype):
    t = torch.randn(4096).to(dtype)
    t[5] = torch.finfo(dtype).max
    t[6] = torch.finfo(dtype).tiny / 4  # subnormal
    assert all_finite(t)
    for bad in (float("inf"), float("-inf"), float("nan")):
        u = t.clone()
        u[1234] = bad
        assert not all_finite(u)
        assert count_non_finite(u) == 1
    assert all_finite(torch.arange(5))
