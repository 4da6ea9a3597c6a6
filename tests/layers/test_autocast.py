"""detcore.layers.autocast.full_precision: float32 inside the block under the caller's bfloat16
autocast, the caller's autocast back after it, nothing to do without autocast."""
import torch

from detcore.layers.autocast import full_precision


def test_a_matmul_inside_stays_float32_under_bfloat16_autocast():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (a @ b).dtype == torch.bfloat16  # autocast does round here
        with full_precision("cpu"):
            inside = a @ b
        assert (a @ b).dtype == torch.bfloat16  # and again after the block
    assert inside.dtype == torch.float32
    torch.testing.assert_close(inside, a @ b, rtol=0, atol=0)


def test_without_autocast_it_changes_nothing():
    with full_precision(torch.device("cpu")):
        assert not torch.is_autocast_enabled("cpu")
        assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.float32
    with full_precision("meta"):  # a device kind autocast does not cover: a no-op
        pass
