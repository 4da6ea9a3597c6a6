"""Turns per-image results (in the resized input frame) into outputs in the original image:
detections (boxes rescaled and clipped, mask probabilities pasted into full-size masks, keypoint
heatmaps decoded into keypoints) and proposals (boxes rescaled and clipped)."""
from detcore.structures import (
    Boxes,
    Instances,
    from_legacy_plus_one,
    heatmaps_to_keypoints,
    paste_masks_in_image,
    to_legacy_plus_one,
)


def detector_postprocess(
    results: Instances,
    output_height: int,
    output_width: int,
    mask_threshold: float = 0.5,
    paste_mode: str = "aligned",
    legacy_plus_one: bool = False,
) -> Instances:
    """Rescale `results` (with `pred_boxes`, optionally `pred_masks` [N, 1, M, M] probabilities and
    `pred_keypoint_heatmaps` [N, K, S, S] logits) from their image size to (output_height,
    output_width). Heatmaps become `pred_keypoints` [N, K, 3] (x, y, score).

    ``legacy_plus_one`` (MODEL.BOX_LEGACY_PLUS_ONE) does what Detectron and maskrcnn-benchmark
    do: scale the inclusive corners ``(x1, y1, x2 - 1, y2 - 1)``, not clip them, and paste masks
    into them."""
    in_height, in_width = results.image_size
    scale_x, scale_y = output_width / in_width, output_height / in_height
    out = Instances((output_height, output_width), **{k: v for k, v in results.fields().items()})
    if results.has("pred_keypoint_heatmaps"):
        # Decoded in the boxes' own frame (each map resized to its box's pixel size there), then
        # scaled, as torchvision and detectron2 do.
        keypoints = heatmaps_to_keypoints(results.pred_keypoint_heatmaps, results.pred_boxes.tensor)
        keypoints[..., 0] *= scale_x
        keypoints[..., 1] *= scale_y
        out.remove("pred_keypoint_heatmaps")
        out.pred_keypoints = keypoints
    boxes = results.pred_boxes.tensor.clone()
    if legacy_plus_one:
        boxes = to_legacy_plus_one(boxes)
    boxes = Boxes(boxes).scale(scale_x, scale_y)
    if legacy_plus_one:
        paste_boxes, boxes = boxes.tensor, Boxes(from_legacy_plus_one(boxes.tensor))
    else:
        paste_boxes = boxes.clip((output_height, output_width)).tensor
    out.pred_boxes = boxes
    if results.has("pred_masks"):
        masks = results.pred_masks
        if masks.dim() == 4:
            masks = masks[:, 0]
        out.pred_masks = paste_masks_in_image(
            masks, paste_boxes, (output_height, output_width), threshold=mask_threshold, mode=paste_mode
        )
    keep = boxes.nonempty()
    return out[keep]



def proposal_postprocess(proposals: Instances, output_height: int, output_width: int) -> Instances:
    """Rescale `proposals` (``proposal_boxes``, ``objectness_logits``) from their image size to
    (output_height, output_width), clip them to it and drop those left empty; the order (by
    decreasing objectness) is kept."""
    in_height, in_width = proposals.image_size
    boxes = Boxes(proposals.proposal_boxes.tensor.clone())
    boxes.scale(output_width / in_width, output_height / in_height)
    boxes.clip((output_height, output_width))
    out = Instances((output_height, output_width), **{k: v for k, v in proposals.fields().items()})
    out.proposal_boxes = boxes
    return out[boxes.nonempty()]
