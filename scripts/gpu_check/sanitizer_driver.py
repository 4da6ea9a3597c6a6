#!/usr/bin/env python
"""Every detcore kernel, forward and backward, on awkward inputs: the program that
scripts/gpu_check.sh runs under compute-sanitizer (memcheck, racecheck, synccheck).

    compute-sanitizer --tool memcheck python scripts/gpu_check/sanitizer_driver.py --device cuda
    python scripts/gpu_check/sanitizer_driver.py --device cpu     # the rehearsal: no sanitizer

Awkward: 0, 1, 63, 64, 65 and 129 boxes or rois (around the NMS mask's 64-bit words and the
kernels' blocks), rois wholly outside the map, of zero or negative size, a map with no pixels,
non-contiguous and channels-last inputs, zero-stride gradients (out.sum()), empty batches, and
every dtype the kernels take (float32, float64, float16, bfloat16; the CPU kernels take the
first two only), and inputs the value checks refuse, passed with the checks off as the model's
own calls run (detcore.layers.trusted_inputs): bad batch indices, non-finite rois, argmax offsets
past the plane. The focal loss runs past one block and one grid-stride pass. Each call is
followed by a synchronization, so that an error is reported at the call that caused it.

The NMS unwrap's global-memory path needs over ~385k boxes (a mask of tens of GB), so it is
not run here; the emulation tests reach it with a lowered limit.

Run it with PYTORCH_NO_CUDA_MEMORY_CACHING=1 under memcheck: every tensor is then its own
allocation, so an access past a tensor's end is out of bounds, not inside a cached block.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from detcore.layers import (  # noqa: E402
    OpArgumentError, batched_nms, deform_conv2d, nms, roi_align, roi_pool, sigmoid_focal_loss, trusted_inputs,
)

SIZES = [0, 1, 63, 64, 65, 129]


class Driver:
    def __init__(self, device):
        self.device = torch.device(device)
        self.calls = 0
        self.gen = torch.Generator().manual_seed(0)

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.calls += 1

    def randn(self, *shape, dtype=torch.float32):
        return torch.randn(*shape, generator=self.gen).to(self.device, dtype)

    def boxes(self, n, dtype, side=150.0):
        xy = torch.rand(n, 2, generator=self.gen) * side
        wh = torch.rand(n, 2, generator=self.gen) * 80 - 10  # some of negative size
        return torch.cat([xy, xy + wh], dim=1).to(self.device, dtype)

    # ------------------------------------------------------------------------------------ ops
    def nms(self, dtype):
        for n in SIZES:
            boxes = self.boxes(n, dtype)
            scores = torch.rand(n, generator=self.gen).to(self.device, dtype)
            idxs = torch.randint(0, 3, (n,), generator=self.gen).to(self.device)
            for threshold in (0.0, 0.5, 1.0):
                keep = nms(boxes, scores, threshold)
                self.sync()
                assert keep.numel() <= n
            keep = batched_nms(boxes, scores, idxs, 0.5)
            self.sync()
            # Non-contiguous boxes and scores (a column of a wider tensor).
            wide = torch.cat([boxes, boxes], dim=1)[:, ::2]
            keep = nms(wide, torch.stack([scores, scores], 1)[:, 1], 0.5)
            self.sync()
            assert keep.numel() <= n
        # Over 5000 boxes batched_nms takes its banded path (nms_band_kernels.cuh): categories of
        # 1, 64, 65 and many boxes.
        idxs = torch.repeat_interleave(torch.arange(4), torch.tensor([1, 64, 65, 4900])).to(self.device)
        boxes = self.boxes(len(idxs), dtype)
        scores = torch.rand(len(idxs), generator=self.gen).to(self.device, dtype)
        keep = batched_nms(boxes, scores, idxs, 0.5)
        self.sync()
        assert keep.numel() <= len(idxs)

    def _rois(self, k, dtype, batch=2):
        boxes = self.boxes(k, dtype, side=200.0)
        if k >= 2:
            boxes[0] = torch.tensor([-300.0, -300.0, -200.0, -250.0])  # wholly outside
            boxes[1] = torch.tensor([40.0, 40.0, 40.0, 40.0])  # a point
        index = (torch.arange(k, device=self.device) % batch).to(dtype)[:, None]
        return torch.cat([index, boxes], dim=1)

    def _features(self, dtype, channels_last=False, size=(11, 13)):
        x = self.randn(2, 3, *size, dtype=dtype)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        return x.requires_grad_(True)

    def roi_align(self, dtype):
        for k in SIZES:
            rois = self._rois(k, dtype)
            for channels_last in (False, True):
                for sampling_ratio, aligned in ((0, True), (2, False)):
                    x = self._features(dtype, channels_last)
                    out = roi_align(x, rois, (3, 4), 0.25, sampling_ratio, aligned)
                    self.sync()
                    out.sum().backward()  # a zero-stride gradient
                    self.sync()
                    grad = self.randn(k, 3, 4, 3, dtype=dtype).transpose(2, 3)  # non-contiguous
                    (g,) = torch.autograd.grad(roi_align(x, rois, (3, 4), 0.25, sampling_ratio, aligned), x, grad)
                    self.sync()
                    assert g.shape == x.shape
        empty_map = self._features(dtype, size=(0, 5))
        roi_align(empty_map, self._rois(5, dtype), 2, 0.25, 0, True).sum().backward()
        self.sync()

    def roi_pool(self, dtype):
        for k in SIZES:
            rois = self._rois(k, dtype)
            for channels_last in (False, True):
                x = self._features(dtype, channels_last)
                out = roi_pool(x, rois, (3, 4), 0.25)
                self.sync()
                out.sum().backward()
                self.sync()
                grad = self.randn(k, 3, 4, 3, dtype=dtype).transpose(2, 3)
                (g,) = torch.autograd.grad(roi_pool(x, rois, (3, 4), 0.25), x, grad)
                self.sync()
                assert g.shape == x.shape

    def unchecked(self, dtype):
        """Rois the checks refuse (batch index -1, 2 of 2, NaN; an infinite corner) with the checks
        off: the CUDA kernels pool zeros for them and pass no gradient back, in bounds. On the CPU
        the checks stay on: they raise."""
        x = self._features(dtype)
        rois = self._rois(6, dtype)
        rois[0, 0], rois[1, 0], rois[2, 0], rois[3, 1] = -1, 2, float("nan"), float("inf")
        ops = [lambda: roi_align(x, rois, (3, 4), 0.25, s, a) for s, a in ((0, True), (2, False))]
        ops.append(lambda: roi_pool(x, rois, (3, 4), 0.25))
        for op in ops:
            try:
                with trusted_inputs():
                    out = op()
            except OpArgumentError:
                assert self.device.type == "cpu", "the CUDA ops check no values inside trusted_inputs()"
                continue
            self.sync()
            out.sum().backward()  # after the block: the backward follows the forward
            self.sync()
            assert torch.equal(out[:4], torch.zeros_like(out[:4]))
        # roi_pool's backward given argmax offsets past the plane (and far past the input).
        grad = self.randn(6, 3, 3, 4, dtype=dtype)
        argmax = torch.full(grad.shape, 11 * 13, dtype=torch.int32, device=self.device)
        argmax[1::2] = 2**31 - 1
        good = self._rois(6, dtype)
        try:
            with trusted_inputs():
                g = torch.ops.detcore._roi_pool_backward(grad, good, argmax, 0.25, 3, 4, 2, 3, 11, 13)
        except OpArgumentError:
            assert self.device.type == "cpu"
            return
        self.sync()
        assert torch.equal(g, torch.zeros_like(g))

    def deform_conv2d(self, dtype):
        for batch in (0, 1, 2):
            for with_mask in (False, True):
                x = self.randn(batch, 4, 7, 8, dtype=dtype)
                weight = self.randn(2, 2, 2, 3, dtype=dtype)
                bias = self.randn(2, dtype=dtype)
                offset = self.randn(batch, 24, 4, 4, dtype=dtype) * 2.5  # many taps off the map
                mask = torch.rand(batch, 12, 4, 4, generator=self.gen).to(self.device, dtype) if with_mask else None
                # Non-contiguous input and offset.
                x = x.transpose(2, 3).contiguous().transpose(2, 3)
                offset = torch.cat([offset, offset], dim=1)[:, ::2] if batch else offset
                leaves = [t.detach().requires_grad_(True) for t in (x, offset, weight, bias)]
                m = mask.detach().requires_grad_(True) if with_mask else None
                out = deform_conv2d(*leaves, stride=(2, 1), padding=(1, 0), dilation=(1, 2), mask=m)
                self.sync()
                grads = torch.autograd.grad(out.sum(), leaves + ([m] if with_mask else []))
                self.sync()
                assert [g.shape for g in grads[:4]] == [t.shape for t in leaves]

    def sigmoid_focal_loss(self, dtype):
        for n in SIZES + [256 * 300 + 7]:  # the last one: many blocks, a partial last block
            x = (self.randn(n, dtype=torch.float64) * 5).to(dtype).requires_grad_(True)
            t = torch.rand(n, generator=self.gen).round().to(self.device, dtype)
            for reduction in ("none", "mean", "sum"):
                for gamma in (0.0, 1.5, 2.0):
                    loss = sigmoid_focal_loss(x, t, 0.25, gamma, reduction)
                    self.sync()
                    grad = torch.ones_like(loss) if reduction != "none" else torch.ones(1, device=self.device, dtype=dtype).expand(n)
                    (g,) = torch.autograd.grad(loss, x, grad)
                    self.sync()
                    assert g.shape == x.shape
        # A non-contiguous [N, K] logits / targets pair, as RetinaNet's class loss has.
        x = self.randn(80, 50, dtype=dtype).t().requires_grad_(True)
        t = (torch.rand(80, 50, generator=self.gen) < 0.05).to(self.device, dtype).t()
        sigmoid_focal_loss(x, t, reduction="sum").backward()
        self.sync()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("sanitizer_driver: --device cuda but torch sees no CUDA GPU")
    dtypes = [torch.float32, torch.float64]
    if args.device == "cuda":
        dtypes += [torch.float16, torch.bfloat16]
    driver = Driver(args.device)
    start = time.perf_counter()
    for op in ("nms", "roi_align", "roi_pool", "unchecked", "deform_conv2d", "sigmoid_focal_loss"):
        for dtype in dtypes:
            getattr(driver, op)(dtype)
        print(f"{op}: done ({', '.join(str(d).replace('torch.', '') for d in dtypes)})", flush=True)
    print(f"sanitizer_driver: {driver.calls} calls on {args.device} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
