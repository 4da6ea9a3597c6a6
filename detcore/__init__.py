"""detcore: Mask R-CNN style detection and instance segmentation with compiled NMS/ROIAlign."""

# torch first: detcore._C links libc10 / libtorch, which are in the process only once torch is
# imported, so `import detcore._C` as a program's first line would fail without this.
import torch  # noqa: F401

__version__ = "0.1.0"
