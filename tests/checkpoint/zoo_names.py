"""Parameter names and shapes of published R-50 checkpoints, written from those projects' model
zoos (not from detcore's code): detectron2's COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_* and
mask_rcnn_R_50_C4_* (model_final_*.pkl), torchvision's maskrcnn_resnet50_fpn_coco (the "v1" module layout of the
published file) and the MSRA ImageNet R-50.pkl in caffe2 blob names (Detectron)."""

# ResNet-50: blocks per stage, bottleneck width of res2 (doubling), output width of res2.
R50_BLOCKS = (3, 4, 6, 3)
FPN_CHANNELS = 256


def _r50_blocks():
    """(stage index 0..3, block index, input channels, bottleneck channels, output channels)."""
    in_channels = 64
    for stage, blocks in enumerate(R50_BLOCKS):
        mid, out = 64 * 2**stage, 256 * 2**stage
        for b in range(blocks):
            yield stage, b, in_channels if b == 0 else out, mid, out
        in_channels = out


def _norm(shapes, prefix, channels, leaves=("weight", "bias", "running_mean", "running_var")):
    for leaf in leaves:
        shapes[f"{prefix}.{leaf}"] = (channels,)


def _detectron2_block(s, p, i, cin, mid, out):
    """One bottleneck in detectron2's names: the norm inside each conv, the projection `shortcut`."""
    if i == 0:
        s[p + "shortcut.weight"] = (out, cin, 1, 1)
        _norm(s, p + "shortcut.norm", out)
    s[p + "conv1.weight"] = (mid, cin, 1, 1)
    _norm(s, p + "conv1.norm", mid)
    s[p + "conv2.weight"] = (mid, mid, 3, 3)
    _norm(s, p + "conv2.norm", mid)
    s[p + "conv3.weight"] = (out, mid, 1, 1)
    _norm(s, p + "conv3.norm", out)


def detectron2_mask_rcnn_r50_fpn_shapes(num_classes=80):
    s = {}
    b = "backbone.bottom_up."
    s[b + "stem.conv1.weight"] = (64, 3, 7, 7)
    _norm(s, b + "stem.conv1.norm", 64)
    for stage, i, cin, mid, out in _r50_blocks():
        _detectron2_block(s, f"{b}res{stage + 2}.{i}.", i, cin, mid, out)
    for level, cin in zip((2, 3, 4, 5), (256, 512, 1024, 2048)):
        s[f"backbone.fpn_lateral{level}.weight"] = (FPN_CHANNELS, cin, 1, 1)
        s[f"backbone.fpn_lateral{level}.bias"] = (FPN_CHANNELS,)
        s[f"backbone.fpn_output{level}.weight"] = (FPN_CHANNELS, FPN_CHANNELS, 3, 3)
        s[f"backbone.fpn_output{level}.bias"] = (FPN_CHANNELS,)
    r = "proposal_generator.rpn_head."
    s[r + "conv.weight"], s[r + "conv.bias"] = (256, 256, 3, 3), (256,)
    s[r + "objectness_logits.weight"], s[r + "objectness_logits.bias"] = (3, 256, 1, 1), (3,)
    s[r + "anchor_deltas.weight"], s[r + "anchor_deltas.bias"] = (12, 256, 1, 1), (12,)
    h = "roi_heads."
    s[h + "box_head.fc1.weight"], s[h + "box_head.fc1.bias"] = (1024, 256 * 7 * 7), (1024,)
    s[h + "box_head.fc2.weight"], s[h + "box_head.fc2.bias"] = (1024, 1024), (1024,)
    s[h + "box_predictor.cls_score.weight"] = (num_classes + 1, 1024)
    s[h + "box_predictor.cls_score.bias"] = (num_classes + 1,)
    s[h + "box_predictor.bbox_pred.weight"] = (num_classes * 4, 1024)
    s[h + "box_predictor.bbox_pred.bias"] = (num_classes * 4,)
    for k in range(1, 5):
        s[f"{h}mask_head.mask_fcn{k}.weight"], s[f"{h}mask_head.mask_fcn{k}.bias"] = (256, 256, 3, 3), (256,)
    s[h + "mask_head.deconv.weight"], s[h + "mask_head.deconv.bias"] = (256, 256, 2, 2), (256,)  # (in, out, k, k)
    s[h + "mask_head.predictor.weight"] = (num_classes, 256, 1, 1)
    s[h + "mask_head.predictor.bias"] = (num_classes,)
    return s


def detectron2_mask_rcnn_r50_c4_shapes(num_classes=80):
    """The C4 model: the body (stem .. res4) is the whole backbone, res5 sits in the ROI heads,
    the RPN has 15 anchors (5 sizes x 3 ratios) on res4, the mask head is a deconv on res5."""
    s = {"backbone.stem.conv1.weight": (64, 3, 7, 7)}
    _norm(s, "backbone.stem.conv1.norm", 64)
    for stage, i, cin, mid, out in _r50_blocks():
        prefix = "roi_heads." if stage == 3 else "backbone."
        _detectron2_block(s, f"{prefix}res{stage + 2}.{i}.", i, cin, mid, out)
    r = "proposal_generator.rpn_head."
    s[r + "conv.weight"], s[r + "conv.bias"] = (1024, 1024, 3, 3), (1024,)
    s[r + "objectness_logits.weight"], s[r + "objectness_logits.bias"] = (15, 1024, 1, 1), (15,)
    s[r + "anchor_deltas.weight"], s[r + "anchor_deltas.bias"] = (60, 1024, 1, 1), (60,)
    h = "roi_heads."
    s[h + "box_predictor.cls_score.weight"] = (num_classes + 1, 2048)
    s[h + "box_predictor.cls_score.bias"] = (num_classes + 1,)
    s[h + "box_predictor.bbox_pred.weight"] = (num_classes * 4, 2048)
    s[h + "box_predictor.bbox_pred.bias"] = (num_classes * 4,)
    s[h + "mask_head.deconv.weight"], s[h + "mask_head.deconv.bias"] = (2048, 256, 2, 2), (256,)  # (in, out, k, k)
    s[h + "mask_head.predictor.weight"] = (num_classes, 256, 1, 1)
    s[h + "mask_head.predictor.bias"] = (num_classes,)
    return s


def torchvision_resnet50_shapes(prefix=""):
    """torchvision.models.resnet50 names (BatchNorm2d, with num_batches_tracked) and the fc."""
    s = {prefix + "conv1.weight": (64, 3, 7, 7)}
    _norm(s, prefix + "bn1", 64)
    s[prefix + "bn1.num_batches_tracked"] = ()
    for stage, i, cin, mid, out in _r50_blocks():
        p = f"{prefix}layer{stage + 1}.{i}."
        for j, (co, ci, k) in enumerate(((mid, cin, 1), (mid, mid, 3), (out, mid, 1)), start=1):
            s[f"{p}conv{j}.weight"] = (co, ci, k, k)
            _norm(s, f"{p}bn{j}", co)
            s[f"{p}bn{j}.num_batches_tracked"] = ()
        if i == 0:
            s[p + "downsample.0.weight"] = (out, cin, 1, 1)
            _norm(s, p + "downsample.1", out)
            s[p + "downsample.1.num_batches_tracked"] = ()
    s[prefix + "fc.weight"], s[prefix + "fc.bias"] = (1000, 2048), (1000,)
    return s


def torchvision_maskrcnn_v1_shapes():
    """maskrcnn_resnet50_fpn_coco: FrozenBatchNorm2d body (no step counters), 91 classes."""
    s = {}
    for name, shape in torchvision_resnet50_shapes("backbone.body.").items():
        if not name.endswith("num_batches_tracked") and ".fc." not in name:
            s[name] = shape
    for i, cin in enumerate((256, 512, 1024, 2048)):
        s[f"backbone.fpn.inner_blocks.{i}.weight"] = (256, cin, 1, 1)
        s[f"backbone.fpn.inner_blocks.{i}.bias"] = (256,)
        s[f"backbone.fpn.layer_blocks.{i}.weight"] = (256, 256, 3, 3)
        s[f"backbone.fpn.layer_blocks.{i}.bias"] = (256,)
    s["rpn.head.conv.weight"], s["rpn.head.conv.bias"] = (256, 256, 3, 3), (256,)
    s["rpn.head.cls_logits.weight"], s["rpn.head.cls_logits.bias"] = (3, 256, 1, 1), (3,)
    s["rpn.head.bbox_pred.weight"], s["rpn.head.bbox_pred.bias"] = (12, 256, 1, 1), (12,)
    s["roi_heads.box_head.fc6.weight"], s["roi_heads.box_head.fc6.bias"] = (1024, 12544), (1024,)
    s["roi_heads.box_head.fc7.weight"], s["roi_heads.box_head.fc7.bias"] = (1024, 1024), (1024,)
    s["roi_heads.box_predictor.cls_score.weight"] = (91, 1024)
    s["roi_heads.box_predictor.cls_score.bias"] = (91,)
    s["roi_heads.box_predictor.bbox_pred.weight"] = (364, 1024)
    s["roi_heads.box_predictor.bbox_pred.bias"] = (364,)
    for k in range(1, 5):
        s[f"roi_heads.mask_head.mask_fcn{k}.weight"] = (256, 256, 3, 3)
        s[f"roi_heads.mask_head.mask_fcn{k}.bias"] = (256,)
    s["roi_heads.mask_predictor.conv5_mask.weight"] = (256, 256, 2, 2)
    s["roi_heads.mask_predictor.conv5_mask.bias"] = (256,)
    s["roi_heads.mask_predictor.mask_fcn_logits.weight"] = (91, 256, 1, 1)
    s["roi_heads.mask_predictor.mask_fcn_logits.bias"] = (91,)
    return s


def caffe2_resnet50_shapes():
    """MSRA R-50.pkl blobs: AffineChannel norms (scale _s, bias _b), the 1000-way classifier."""
    s = {"conv1_w": (64, 3, 7, 7), "res_conv1_bn_s": (64,), "res_conv1_bn_b": (64,)}
    for stage, i, cin, mid, out in _r50_blocks():
        p = f"res{stage + 2}_{i}_"
        for branch, (co, ci, k) in zip("abc", ((mid, cin, 1), (mid, mid, 3), (out, mid, 1))):
            s[f"{p}branch2{branch}_w"] = (co, ci, k, k)
            s[f"{p}branch2{branch}_bn_s"] = (co,)
            s[f"{p}branch2{branch}_bn_b"] = (co,)
        if i == 0:
            s[f"{p}branch1_w"] = (out, cin, 1, 1)
            s[f"{p}branch1_bn_s"] = (out,)
            s[f"{p}branch1_bn_b"] = (out,)
    s["fc1000_w"], s["fc1000_b"] = (1000, 2048), (1000,)
    return s
