"""detcore: Mask R-CNN style detection and instance segmentation with compiled NMS/ROIAlign."""

# torch first: detcore._C links libc10 / libtorch, which are in the process only once torch is
# imported, so `import detcore._C` as a program's first line would fail without this.
import torch  # noqa: F401

__version__ = "0.1.0"

# detcore's ops (torch.ops.detcore.*, with their fake kernels) are registered when the compiled
# extension loads: a program that imports only detcore can then load an exported model that calls
# them (torch.jit.load, torch.export.load), as export.json says. Without a usable _C nothing fails
# here: the first op call says why and how to build it (layers/_extension.py).
from .layers import _extension  # noqa: E402,F401
