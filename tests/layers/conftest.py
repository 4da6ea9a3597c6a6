"""Fixtures of the op tests."""
import pytest

try:
    from . import cuda_emulation
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    import cuda_emulation


@pytest.fixture(scope="module")
def emu():
    """torch.ops.detcore_emulated: detcore's CUDA kernels run by the CUDA emulation (built once)."""
    return cuda_emulation.load()
