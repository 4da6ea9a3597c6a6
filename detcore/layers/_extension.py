"""Loads detcore._C (which registers torch.ops.detcore.*) and gives a clear error if it can't.
``import detcore`` imports this module, so the ops exist in any program that imports detcore; a
missing or unusable _C fails nothing here, only the first op call (``ensure_loaded``).

Also registers the ops' fake (meta) kernels, which let torch.compile and other tracers reason
about output shapes without running the kernels.
"""
import importlib
import os

import torch

_BUILD_HINT = (
    "Build it from the repository root with:\n"
    "    pip install --no-build-isolation -e .\n"
    "(needs torch installed first; CUDA kernels are added when nvcc is found and a GPU is "
    "visible, or with FORCE_CUDA=1). Run `python -m detcore.utils.collect_env` for a report."
)

_load_error = None


def _load():
    global _load_error
    try:
        importlib.import_module("detcore._C")
    except ImportError as e:  # missing build, or built against another torch (undefined symbol)
        _load_error = e
        return False
    return True


_loaded = _load()


# The error of every op argument check (C++ and Python): both a ValueError and a RuntimeError.
if _loaded:
    from detcore._C import OpArgumentError
else:  # the Python-side checks still raise the same kind of error

    class OpArgumentError(ValueError, RuntimeError):
        """An argument of a detcore op is invalid."""


def ensure_loaded():
    """Raise an error that says what to do if detcore._C is not usable."""
    if _loaded:
        return
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    reason = str(_load_error)
    if "undefined symbol" in reason or "version" in reason.lower():
        what = (
            f"detcore._C in {package_dir} was built against a different PyTorch than the one "
            f"running now (torch {torch.__version__}): {reason}\nRebuild it. "
        )
    else:
        what = f"detcore's compiled extension detcore._C is not built or failed to load ({reason}).\n"
    raise RuntimeError(what + _BUILD_HINT)


def is_available():
    return _loaded


def check_int64(op: str, **values: int) -> None:
    """The ops' schemas take 64-bit ints; a larger Python int would fail in the dispatcher with
    "Expected a value of type 'int' ... found type 'int'". Refuse it naming the argument (the
    C++ checks then say what range each argument may take). Eager mode only."""
    for name, value in values.items():
        if not -(2**63) <= value < 2**63:
            raise OpArgumentError(f"{op}: {name} must be an integer that fits in 64 bits, got {value}")


def cuda_kernels_built():
    """Whether this build of _C carries CUDA kernels."""
    return _loaded and torch.ops.detcore._cuda_version() > 0


def _fake(op: str):
    """``torch.library.register_fake(op)``; a _C built from older sources that lacks ``op`` makes
    the extension count as not loaded (the first op call says to rebuild) rather than failing
    ``import detcore``, which loads this module."""

    def register(kernel):
        global _loaded, _load_error
        try:
            torch.library.register_fake(op)(kernel)
        except RuntimeError as e:  # "operator detcore::... does not exist"
            _loaded = False
            _load_error = ImportError(f"detcore._C lacks the op {op}: it was built from older sources ({e})")
        return kernel

    return register


if _loaded:

    @_fake("detcore::nms")
    def _nms_fake(boxes, scores, iou_threshold):
        torch._check(boxes.dim() == 2 and boxes.size(1) == 4, lambda: "nms: boxes must be [N, 4]")
        torch._check(scores.dim() == 1, lambda: "nms: scores must be [N]")
        kept = torch.library.get_ctx().new_dynamic_size()
        return boxes.new_empty((kept,), dtype=torch.int64)

    @_fake("detcore::batched_nms")
    def _batched_nms_fake(boxes, scores, idxs, iou_threshold):
        torch._check(boxes.dim() == 2 and boxes.size(1) == 4, lambda: "batched_nms: boxes must be [N, 4]")
        kept = torch.library.get_ctx().new_dynamic_size()
        return boxes.new_empty((kept,), dtype=torch.int64)

    @_fake("detcore::roi_align")
    def _roi_align_fake(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
        torch._check(input.dim() == 4, lambda: "roi_align: input must be [N, C, H, W]")
        torch._check(rois.dim() == 2 and rois.size(1) == 5, lambda: "roi_align: rois must be [K, 5]")
        return input.new_empty((rois.size(0), input.size(1), pooled_height, pooled_width))

    @_fake("detcore::_roi_align_backward")
    def _roi_align_backward_fake(
        grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
        sampling_ratio, aligned,
    ):
        return grad.new_empty((batch_size, channels, height, width))

    @_fake("detcore::roi_pool")
    def _roi_pool_fake(input, rois, spatial_scale, pooled_height, pooled_width):
        torch._check(input.dim() == 4, lambda: "roi_pool: input must be [N, C, H, W]")
        torch._check(rois.dim() == 2 and rois.size(1) == 5, lambda: "roi_pool: rois must be [K, 5]")
        shape = (rois.size(0), input.size(1), pooled_height, pooled_width)
        return input.new_empty(shape), input.new_empty(shape, dtype=torch.int32)

    @_fake("detcore::_roi_pool_backward")
    def _roi_pool_backward_fake(
        grad, rois, argmax, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
    ):
        return grad.new_empty((batch_size, channels, height, width))

    def _deform_conv2d_out_size(input, weight, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w):
        out_h = (input.size(2) + 2 * pad_h - (dilation_h * (weight.size(2) - 1) + 1)) // stride_h + 1
        out_w = (input.size(3) + 2 * pad_w - (dilation_w * (weight.size(3) - 1) + 1)) // stride_w + 1
        return out_h, out_w

    @_fake("detcore::deform_conv2d")
    def _deform_conv2d_fake(
        input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
        groups, offset_groups,
    ):
        torch._check(input.dim() == 4, lambda: "deform_conv2d: input must be [N, C, H, W]")
        torch._check(weight.dim() == 4, lambda: "deform_conv2d: weight must be [O, C / groups, kh, kw]")
        out_h, out_w = _deform_conv2d_out_size(
            input, weight, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w
        )
        return input.new_empty((input.size(0), weight.size(0), out_h, out_w))

    @_fake("detcore::_deform_conv2d_backward")
    def _deform_conv2d_backward_fake(
        grad, input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h,
        dilation_w, groups, offset_groups,
    ):
        grad_mask = mask.new_empty(mask.shape) if mask is not None else input.new_empty((0,))
        return (
            input.new_empty(input.shape),
            weight.new_empty(weight.shape),
            offset.new_empty(offset.shape),
            grad_mask,
            input.new_empty((weight.size(0),)),
        )

    @_fake("detcore::sigmoid_focal_loss")
    def _sigmoid_focal_loss_fake(inputs, targets, alpha, gamma, reduction):
        torch._check(
            inputs.shape == targets.shape, lambda: "sigmoid_focal_loss: targets must have the shape of inputs"
        )
        return inputs.new_empty(inputs.shape if reduction == "none" else ())

    @_fake("detcore::_sigmoid_focal_loss_backward")
    def _sigmoid_focal_loss_backward_fake(grad, inputs, targets, alpha, gamma, reduction, targets_grad):
        grad_targets = inputs.new_empty(inputs.shape if targets_grad else (0,))
        return inputs.new_empty(inputs.shape), grad_targets
