"""Box coding: boxes <-> regression deltas (dx, dy, dw, dh), and the box regression loss.

The R-CNN parameterization: for a source box (anchor or proposal) with center (px, py) and size
(pw, ph), and a target with (gx, gy, gw, gh),

    dx = wx * (gx - px) / pw     dy = wy * (gy - py) / ph
    dw = ww * log(gw / pw)       dh = wh * log(gh / ph)

Boxes are float xyxy with width = x2 - x1 (no "+1"), centers at x1 + w / 2.
"""
import math
from typing import Sequence, Tuple

import torch
import torch.nn.functional as F

__all__ = ["Box2BoxTransform", "box_loss", "box_regression_loss", "giou_loss"]

# exp(dw) may not exceed 1000 / 16: a 16 px box can grow to at most 1000 px in one step. Without a
# clamp an early, untrained regression output overflows exp() to inf.
_DEFAULT_SCALE_CLAMP = math.log(1000.0 / 16)


def _check_boxes(boxes: torch.Tensor, name: str) -> None:
    if not isinstance(boxes, torch.Tensor):
        raise TypeError(f"{name} must be a Tensor[N, 4], got {type(boxes).__name__}")
    if boxes.dim() != 2 or boxes.shape[1] != 4:
        raise ValueError(f"{name} must have shape [N, 4], got {tuple(boxes.shape)}")


class Box2BoxTransform:
    """Encodes a box as deltas relative to a source box, and decodes deltas back into boxes.

    Args:
        weights: ``(wx, wy, ww, wh)`` multipliers of the deltas. ``(1, 1, 1, 1)`` for the RPN,
            ``(10, 10, 5, 5)`` for the Fast R-CNN head (scales its small targets to ~unit variance).
        scale_clamp: upper bound on the decoded ``dw`` and ``dh`` (after dividing by the weights).
    """

    def __init__(self, weights: Sequence[float], scale_clamp: float = _DEFAULT_SCALE_CLAMP):
        if len(weights) != 4:
            raise ValueError(f"Box2BoxTransform: weights must be 4 numbers (wx, wy, ww, wh), got {weights!r}")
        self.weights: Tuple[float, float, float, float] = tuple(float(w) for w in weights)
        self.scale_clamp = float(scale_clamp)

    def get_deltas(self, src_boxes: torch.Tensor, target_boxes: torch.Tensor) -> torch.Tensor:
        """``[N, 4]`` deltas that turn each ``src_boxes[i]`` into ``target_boxes[i]``.

        Source boxes must have positive width and height (the deltas divide by them).
        """
        _check_boxes(src_boxes, "get_deltas: src_boxes")
        _check_boxes(target_boxes, "get_deltas: target_boxes")
        if src_boxes.shape[0] != target_boxes.shape[0]:
            raise ValueError(
                f"get_deltas: src_boxes has {src_boxes.shape[0]} boxes but target_boxes has "
                f"{target_boxes.shape[0]}; they are paired one to one"
            )
        target_boxes = target_boxes.to(src_boxes.dtype)
        src_w = src_boxes[:, 2] - src_boxes[:, 0]
        src_h = src_boxes[:, 3] - src_boxes[:, 1]
        src_cx = src_boxes[:, 0] + 0.5 * src_w
        src_cy = src_boxes[:, 1] + 0.5 * src_h

        tgt_w = target_boxes[:, 2] - target_boxes[:, 0]
        tgt_h = target_boxes[:, 3] - target_boxes[:, 1]
        tgt_cx = target_boxes[:, 0] + 0.5 * tgt_w
        tgt_cy = target_boxes[:, 1] + 0.5 * tgt_h

        wx, wy, ww, wh = self.weights
        dx = wx * (tgt_cx - src_cx) / src_w
        dy = wy * (tgt_cy - src_cy) / src_h
        dw = ww * torch.log(tgt_w / src_w)
        dh = wh * torch.log(tgt_h / src_h)
        return torch.stack((dx, dy, dw, dh), dim=1)

    def apply_deltas(self, deltas: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """Decode ``deltas [N, k*4]`` (k boxes per row, e.g. one per class) against ``boxes [N, 4]``.

        Returns ``[N, k*4]`` xyxy boxes, float64 for float64 deltas and float32 otherwise.
        """
        if not isinstance(deltas, torch.Tensor) or deltas.dim() != 2 or deltas.shape[1] % 4 != 0:
            shape = tuple(deltas.shape) if isinstance(deltas, torch.Tensor) else type(deltas).__name__
            raise ValueError(f"apply_deltas: deltas must have shape [N, k*4], got {shape}")
        _check_boxes(boxes, "apply_deltas: boxes")
        if boxes.shape[0] != deltas.shape[0]:
            raise ValueError(
                f"apply_deltas: deltas has {deltas.shape[0]} rows but boxes has {boxes.shape[0]}"
            )
        if deltas.dtype not in (torch.float32, torch.float64):
            # Half precision (AMP) cannot place a box corner to the pixel beyond ~1000 px.
            deltas = deltas.float()
        boxes = boxes.to(deltas.dtype)

        widths = boxes[:, 2] - boxes[:, 0]
        heights = boxes[:, 3] - boxes[:, 1]
        ctr_x = boxes[:, 0] + 0.5 * widths
        ctr_y = boxes[:, 1] + 0.5 * heights

        wx, wy, ww, wh = self.weights
        # Every column of a given kind: dx at 0, 4, 8, ...
        dx = deltas[:, 0::4] / wx
        dy = deltas[:, 1::4] / wy
        dw = (deltas[:, 2::4] / ww).clamp(max=self.scale_clamp)
        dh = (deltas[:, 3::4] / wh).clamp(max=self.scale_clamp)

        pred_ctr_x = dx * widths[:, None] + ctr_x[:, None]
        pred_ctr_y = dy * heights[:, None] + ctr_y[:, None]
        pred_w = torch.exp(dw) * widths[:, None]
        pred_h = torch.exp(dh) * heights[:, None]

        half_w = 0.5 * pred_w
        half_h = 0.5 * pred_h
        pred = torch.stack(
            (pred_ctr_x - half_w, pred_ctr_y - half_h, pred_ctr_x + half_w, pred_ctr_y + half_h), dim=2
        )
        return pred.reshape(deltas.shape)


def box_regression_loss(
    pred_deltas: torch.Tensor,
    target_deltas: torch.Tensor,
    loss_type: str = "smooth_l1",
    smooth_l1_beta: float = 0.0,
) -> torch.Tensor:
    """Summed (not averaged) regression loss between ``[N, 4]`` predicted and target deltas.

    ``loss_type`` is ``"smooth_l1"`` (with ``smooth_l1_beta``; beta < 1e-5 means plain L1, which
    also avoids the 0/0 a tiny beta would give) or ``"l1"``. Callers divide by their own normalizer.
    """
    if pred_deltas.shape != target_deltas.shape:
        raise ValueError(
            f"box_regression_loss: pred_deltas {tuple(pred_deltas.shape)} and target_deltas "
            f"{tuple(target_deltas.shape)} must have the same shape"
        )
    if loss_type == "smooth_l1":
        if smooth_l1_beta < 1e-5:
            return F.l1_loss(pred_deltas, target_deltas, reduction="sum")
        return F.smooth_l1_loss(pred_deltas, target_deltas, beta=smooth_l1_beta, reduction="sum")
    if loss_type == "l1":
        return F.l1_loss(pred_deltas, target_deltas, reduction="sum")
    raise ValueError(f"box_regression_loss: loss_type must be 'smooth_l1' or 'l1', got {loss_type!r}")


def giou_loss(boxes1: torch.Tensor, boxes2: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Summed ``1 - GIoU`` of paired ``[N, 4]`` xyxy boxes (Rezatofighi et al., 2019).

    Unlike a loss on deltas it is measured on the decoded boxes, so it is scale invariant.
    """
    if boxes1.shape != boxes2.shape or boxes1.dim() != 2 or boxes1.shape[1] != 4:
        raise ValueError(
            f"giou_loss: boxes1 {tuple(boxes1.shape)} and boxes2 {tuple(boxes2.shape)} must both be [N, 4]"
        )
    x1, y1, x2, y2 = boxes1.unbind(dim=1)
    u1, v1, u2, v2 = boxes2.unbind(dim=1)
    inter_w = (torch.minimum(x2, u2) - torch.maximum(x1, u1)).clamp(min=0)
    inter_h = (torch.minimum(y2, v2) - torch.maximum(y1, v1)).clamp(min=0)
    inter = inter_w * inter_h
    union = (x2 - x1) * (y2 - y1) + (u2 - u1) * (v2 - v1) - inter
    iou = inter / (union + eps)
    # The smallest box enclosing both: its empty part penalizes boxes that do not overlap at all.
    hull = (torch.maximum(x2, u2) - torch.minimum(x1, u1)) * (torch.maximum(y2, v2) - torch.minimum(y1, v1))
    giou = iou - (hull - union) / (hull + eps)
    return (1.0 - giou).sum()


def box_loss(
    box2box_transform: Box2BoxTransform,
    src_boxes: torch.Tensor,
    pred_deltas: torch.Tensor,
    gt_boxes: torch.Tensor,
    loss_type: str = "smooth_l1",
    smooth_l1_beta: float = 0.0,
) -> torch.Tensor:
    """The summed box loss of ``[N, 4]`` predicted deltas relative to ``src_boxes`` (anchors or
    proposals) against their ``gt_boxes``: ``"smooth_l1"`` / ``"l1"`` on the deltas (the targets
    encoded by ``box2box_transform``) or ``"giou"`` on the decoded boxes. The one box loss of the
    RPN, the Fast R-CNN head and RetinaNet; callers divide by their own normalizer.

    Computed in float32 at least: under AMP the deltas are half precision, the boxes need not be.
    """
    pred_deltas = pred_deltas.to(torch.promote_types(pred_deltas.dtype, torch.float32))
    src_boxes = src_boxes.to(pred_deltas.dtype)
    gt_boxes = gt_boxes.to(pred_deltas.dtype)
    if loss_type == "giou":
        return giou_loss(box2box_transform.apply_deltas(pred_deltas, src_boxes), gt_boxes)
    target = box2box_transform.get_deltas(src_boxes, gt_boxes)
    return box_regression_loss(pred_deltas, target, loss_type, smooth_l1_beta)
