"""Parameter names and shapes of published R-50 checkpoints, written from those projects' model
zoos and model code (not from detcore's): detectron2's COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_*,
mask_rcnn_R_50_C4_* and COCO-Detection/retinanet_R_50_FPN_1x (model_final_*.pkl), maskrcnn-benchmark's
e2e_mask_rcnn_R_50_{FPN,C4}_1x (.pth) and Detectron's e2e_mask_rcnn_R-50-{FPN,C4}_1x (model_final.pkl),
torchvision's maskrcnn_resnet50_fpn_coco and retinanet_resnet50_fpn_coco (the "v1" module layout of
the published files) and the MSRA ImageNet R-50.pkl in caffe2 blob names (Detectron)."""

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


def detectron2_imagenet_resnet50_shapes():
    """detectron2's ImageNetPretrained/MSRA/R-50.pkl: caffe2 blob names, but BatchNorm kept unfused
    (its MODEL_ZOO.md: "we do not fuse BatchNorm into an affine layer"), as detectron2's loading
    logs show them (``... loaded from res2_0_branch2a_bn_running_mean``): _bn_gamma, _bn_beta,
    _bn_running_mean, _bn_running_var beside each conv's _w."""
    s = {}
    for name, shape in caffe2_resnet50_shapes().items():
        if name.endswith("_bn_s"):
            base = name[: -len("_s")]
            for leaf in ("gamma", "beta", "running_mean", "running_var"):
                s[f"{base}_{leaf}"] = shape
        elif not name.endswith("_bn_b"):
            s[name] = shape
    return s


def maskrcnn_benchmark_mask_rcnn_r50_fpn_shapes(ddp=True):
    """maskrcnn-benchmark's e2e_mask_rcnn_R_50_FPN_1x model (maskrcnn_benchmark/modeling): a
    `backbone` Sequential of `body` (ResNet: StemWithFixedBatchNorm `stem.conv1` / `stem.bn1`,
    stages `layer1`..`layer4` of Bottlenecks with FrozenBatchNorm2d, which keeps weight, bias,
    running_mean, running_var) and `fpn` (`fpn_inner1..4` 1x1 laterals, `fpn_layer1..4` 3x3
    outputs, numbered from the res2 stage); `rpn` (AnchorGenerator's `cell_anchors` BufferList,
    RPNHead `conv` / `cls_logits` / `bbox_pred`); `roi_heads.box` (FPN2MLPFeatureExtractor
    `fc6` / `fc7`, FPNPredictor `cls_score` / `bbox_pred` over 81 classes, background first) and
    `roi_heads.mask` (MaskRCNNFPNFeatureExtractor `mask_fcn1..4`, MaskRCNNC4Predictor
    `conv5_mask` / `mask_fcn_logits`). Saved from a DistributedDataParallel model: "module."."""
    s = {"backbone.body.stem.conv1.weight": (64, 3, 7, 7)}
    _norm(s, "backbone.body.stem.bn1", 64)
    _maskrcnn_benchmark_resnet(s, "backbone.body.", stages=(1, 2, 3, 4))
    for idx, cin in enumerate((256, 512, 1024, 2048), start=1):
        s[f"backbone.fpn.fpn_inner{idx}.weight"] = (256, cin, 1, 1)
        s[f"backbone.fpn.fpn_inner{idx}.bias"] = (256,)
        s[f"backbone.fpn.fpn_layer{idx}.weight"] = (256, 256, 3, 3)
        s[f"backbone.fpn.fpn_layer{idx}.bias"] = (256,)
    for level in range(5):
        s[f"rpn.anchor_generator.cell_anchors.{level}"] = (3, 4)
    s["rpn.head.conv.weight"], s["rpn.head.conv.bias"] = (256, 256, 3, 3), (256,)
    s["rpn.head.cls_logits.weight"], s["rpn.head.cls_logits.bias"] = (3, 256, 1, 1), (3,)
    s["rpn.head.bbox_pred.weight"], s["rpn.head.bbox_pred.bias"] = (12, 256, 1, 1), (12,)
    b = "roi_heads.box."
    s[b + "feature_extractor.fc6.weight"], s[b + "feature_extractor.fc6.bias"] = (1024, 12544), (1024,)
    s[b + "feature_extractor.fc7.weight"], s[b + "feature_extractor.fc7.bias"] = (1024, 1024), (1024,)
    s[b + "predictor.cls_score.weight"], s[b + "predictor.cls_score.bias"] = (81, 1024), (81,)
    s[b + "predictor.bbox_pred.weight"], s[b + "predictor.bbox_pred.bias"] = (324, 1024), (324,)
    m = "roi_heads.mask."
    for k in range(1, 5):
        s[f"{m}feature_extractor.mask_fcn{k}.weight"] = (256, 256, 3, 3)
        s[f"{m}feature_extractor.mask_fcn{k}.bias"] = (256,)
    s[m + "predictor.conv5_mask.weight"], s[m + "predictor.conv5_mask.bias"] = (256, 256, 2, 2), (256,)
    s[m + "predictor.mask_fcn_logits.weight"], s[m + "predictor.mask_fcn_logits.bias"] = (81, 256, 1, 1), (81,)
    return {("module." + k if ddp else k): v for k, v in s.items()}


def caffe2_detectron_mask_rcnn_r50_fpn_shapes(momentum=True):
    """Detectron's e2e_mask_rcnn_R-50-FPN_1x model_final.pkl blobs (detectron/modeling): the
    MSRA R-50 body (AffineChannel norms) without its classifier; FPN.py's laterals named after
    the body output they read (`fpn_inner_res5_2_sum` on res5, `fpn_inner_res4_5_sum_lateral`
    ... on the others) and outputs `fpn_res5_2_sum` ...; one RPN head shared by all levels,
    stored on the finest (`conv_rpn_fpn2`, `rpn_cls_logits_fpn2`, `rpn_bbox_pred_fpn2`); the 2-fc
    box head (`fc6`, `fc7`, `cls_score`, `bbox_pred`; 81 classes, background first); the mask
    head (`_[mask]_fcn1..4`, `conv5_mask`, `mask_fcn_logits`). Trained weights carry a
    `_momentum` blob each (SGD state): the heads and the res3..res5 convs, not the frozen stem and
    res2 nor the AffineChannel norms."""
    s = {k: v for k, v in caffe2_resnet50_shapes().items() if not k.startswith("fc1000")}
    # res3..res5 convs train (FREEZE_AT 2); AffineChannel norms never do.
    trainable = [(k[: -len("_w")], v) for k, v in s.items() if k[:4] in ("res3", "res4", "res5") and k.endswith("_w")]
    outputs = {2: "res2_2_sum", 3: "res3_3_sum", 4: "res4_5_sum", 5: "res5_2_sum"}
    for level, cin in zip((2, 3, 4, 5), (256, 512, 1024, 2048)):
        lateral = f"fpn_inner_{outputs[level]}" + ("" if level == 5 else "_lateral")
        trainable += [(lateral, (256, cin, 1, 1)), (f"fpn_{outputs[level]}", (256, 256, 3, 3))]
    trainable += [("conv_rpn_fpn2", (256, 256, 3, 3)), ("rpn_cls_logits_fpn2", (3, 256, 1, 1)),
                  ("rpn_bbox_pred_fpn2", (12, 256, 1, 1)), ("fc6", (1024, 12544)), ("fc7", (1024, 1024)),
                  ("cls_score", (81, 1024)), ("bbox_pred", (324, 1024))]  # fmt: skip
    trainable += [(f"_[mask]_fcn{k}", (256, 256, 3, 3)) for k in range(1, 5)]
    trainable += [("conv5_mask", (256, 256, 2, 2)), ("mask_fcn_logits", (81, 256, 1, 1))]
    for blob, shape in trainable:
        leaves = [("w", shape)]
        if not blob.startswith("res"):  # body convs have no bias
            leaves.append(("b", (shape[1] if blob == "conv5_mask" else shape[0],)))
        for leaf, leaf_shape in leaves:
            s[f"{blob}_{leaf}"] = leaf_shape
            if momentum:
                s[f"{blob}_{leaf}_momentum"] = leaf_shape
    return s


def _maskrcnn_benchmark_resnet(s, prefix, stages):
    """maskrcnn-benchmark ResNet stages (torchvision's Bottleneck names, FrozenBatchNorm2d with
    weight, bias, running_mean, running_var) `layer{k}` for k in ``stages`` (1-based) under ``prefix``."""
    for stage, i, cin, mid, out in _r50_blocks():
        if stage + 1 not in stages:
            continue
        p = f"{prefix}layer{stage + 1}.{i}."
        if i == 0:
            s[p + "downsample.0.weight"] = (out, cin, 1, 1)
            _norm(s, p + "downsample.1", out)
        for j, (co, ci, k) in enumerate(((mid, cin, 1), (mid, mid, 3), (out, mid, 1)), start=1):
            s[f"{p}conv{j}.weight"] = (co, ci, k, k)
            _norm(s, f"{p}bn{j}", co)


def maskrcnn_benchmark_mask_rcnn_r50_c4_shapes(ddp=True):
    """maskrcnn-benchmark's e2e_mask_rcnn_R_50_C4_1x model: `backbone` is a Sequential holding
    only `body` (CONV_BODY "R-50-C4": the stem and layer1..layer3); `rpn` (one AnchorGenerator
    level of 15 anchors, RPNHead on 1024 channels); `roi_heads.box` (ResNet50Conv5ROIFeatureExtractor:
    a ResNetHead whose one stage is `head.layer4`, FastRCNNPredictor `cls_score` / `bbox_pred` on
    2048, 81 classes) and `roi_heads.mask` (SHARE_BOX_FEATURE_EXTRACTOR True: CombinedROIHeads
    assigns the box head's feature_extractor to the mask head, so the same module appears under
    both names; MaskRCNNC4Predictor `conv5_mask` 2048 -> 256, `mask_fcn_logits`)."""
    s = {"backbone.body.stem.conv1.weight": (64, 3, 7, 7)}
    _norm(s, "backbone.body.stem.bn1", 64)
    _maskrcnn_benchmark_resnet(s, "backbone.body.", (1, 2, 3))
    s["rpn.anchor_generator.cell_anchors.0"] = (15, 4)
    s["rpn.head.conv.weight"], s["rpn.head.conv.bias"] = (1024, 1024, 3, 3), (1024,)
    s["rpn.head.cls_logits.weight"], s["rpn.head.cls_logits.bias"] = (15, 1024, 1, 1), (15,)
    s["rpn.head.bbox_pred.weight"], s["rpn.head.bbox_pred.bias"] = (60, 1024, 1, 1), (60,)
    _maskrcnn_benchmark_resnet(s, "roi_heads.box.feature_extractor.head.", (4,))
    b = "roi_heads.box."
    s[b + "predictor.cls_score.weight"], s[b + "predictor.cls_score.bias"] = (81, 2048), (81,)
    s[b + "predictor.bbox_pred.weight"], s[b + "predictor.bbox_pred.bias"] = (324, 2048), (324,)
    _maskrcnn_benchmark_resnet(s, "roi_heads.mask.feature_extractor.head.", (4,))
    m = "roi_heads.mask."
    s[m + "predictor.conv5_mask.weight"], s[m + "predictor.conv5_mask.bias"] = (2048, 256, 2, 2), (256,)
    s[m + "predictor.mask_fcn_logits.weight"], s[m + "predictor.mask_fcn_logits.bias"] = (81, 256, 1, 1), (81,)
    return {("module." + k if ddp else k): v for k, v in s.items()}


def caffe2_detectron_mask_rcnn_r50_c4_shapes(momentum=True):
    """Detectron's e2e_mask_rcnn_R-50-C4_1x model_final.pkl blobs: the MSRA R-50 body through
    res4 and, as the box head, ResNet.add_ResNet_roi_conv5_head's stage under the same `res5_*`
    names; the single-scale RPN (rpn_heads: `conv_rpn`, `rpn_cls_logits`, `rpn_bbox_pred`, 15
    anchors); `cls_score` / `bbox_pred` on 2048; mask_rcnn_fcn_head_v0upshare, which reuses res5
    and adds `conv5_mask` (2048 -> 256) and `mask_fcn_logits`. `_momentum` blobs for the
    trained weights (res3 .. res5 convs and the heads)."""
    s = {k: v for k, v in caffe2_resnet50_shapes().items() if not k.startswith("fc1000")}
    trainable = [(k[: -len("_w")], v) for k, v in s.items() if k[:4] in ("res3", "res4", "res5") and k.endswith("_w")]
    trainable += [("conv_rpn", (1024, 1024, 3, 3)), ("rpn_cls_logits", (15, 1024, 1, 1)),
                  ("rpn_bbox_pred", (60, 1024, 1, 1)), ("cls_score", (81, 2048)), ("bbox_pred", (324, 2048)),
                  ("conv5_mask", (2048, 256, 2, 2)), ("mask_fcn_logits", (81, 256, 1, 1))]  # fmt: skip
    for blob, shape in trainable:
        leaves = [("w", shape)]
        if not blob.startswith("res"):
            leaves.append(("b", (shape[1] if blob == "conv5_mask" else shape[0],)))
        for leaf, leaf_shape in leaves:
            s[f"{blob}_{leaf}"] = leaf_shape
            if momentum:
                s[f"{blob}_{leaf}_momentum"] = leaf_shape
    return s


def detectron2_retinanet_r50_fpn_shapes(num_classes=80):
    """COCO-Detection/retinanet_R_50_FPN_1x (model_final_bfca0b.pkl): FPN on res3-res5, P6/P7 from
    res5, 9 anchors x 80 sigmoid classes."""
    s = {k: v for k, v in detectron2_mask_rcnn_r50_fpn_shapes().items() if k.startswith("backbone.bottom_up.")}
    for level, cin in zip((3, 4, 5), (512, 1024, 2048)):
        s[f"backbone.fpn_lateral{level}.weight"] = (FPN_CHANNELS, cin, 1, 1)
        s[f"backbone.fpn_lateral{level}.bias"] = (FPN_CHANNELS,)
        s[f"backbone.fpn_output{level}.weight"] = (FPN_CHANNELS, FPN_CHANNELS, 3, 3)
        s[f"backbone.fpn_output{level}.bias"] = (FPN_CHANNELS,)
    s["backbone.top_block.p6.weight"], s["backbone.top_block.p6.bias"] = (256, 2048, 3, 3), (256,)
    s["backbone.top_block.p7.weight"], s["backbone.top_block.p7.bias"] = (256, 256, 3, 3), (256,)
    for tower in ("cls_subnet", "bbox_subnet"):
        for i in range(4):
            s[f"head.{tower}.{2 * i}.weight"], s[f"head.{tower}.{2 * i}.bias"] = (256, 256, 3, 3), (256,)
    s["head.cls_score.weight"], s["head.cls_score.bias"] = (9 * num_classes, 256, 3, 3), (9 * num_classes,)
    s["head.bbox_pred.weight"], s["head.bbox_pred.bias"] = (36, 256, 3, 3), (36,)
    return s


def torchvision_retinanet_v1_shapes():
    """retinanet_resnet50_fpn_coco (the published file: v1 layout, conv.{0,2,4,6} towers):
    FrozenBatchNorm2d body, FPN on layer2-layer4, P6/P7 from P5, 9 anchors x 91 outputs."""
    s = {}
    for name, shape in torchvision_resnet50_shapes("backbone.body.").items():
        if not name.endswith("num_batches_tracked") and ".fc." not in name:
            s[name] = shape
    for i, cin in enumerate((512, 1024, 2048)):
        s[f"backbone.fpn.inner_blocks.{i}.weight"] = (256, cin, 1, 1)
        s[f"backbone.fpn.inner_blocks.{i}.bias"] = (256,)
        s[f"backbone.fpn.layer_blocks.{i}.weight"] = (256, 256, 3, 3)
        s[f"backbone.fpn.layer_blocks.{i}.bias"] = (256,)
    for p in ("p6", "p7"):
        s[f"backbone.fpn.extra_blocks.{p}.weight"], s[f"backbone.fpn.extra_blocks.{p}.bias"] = (256, 256, 3, 3), (256,)
    for head in ("classification_head", "regression_head"):
        for i in range(4):
            s[f"head.{head}.conv.{2 * i}.weight"], s[f"head.{head}.conv.{2 * i}.bias"] = (256, 256, 3, 3), (256,)
    s["head.classification_head.cls_logits.weight"] = (9 * 91, 256, 3, 3)
    s["head.classification_head.cls_logits.bias"] = (9 * 91,)
    s["head.regression_head.bbox_reg.weight"], s["head.regression_head.bbox_reg.bias"] = (36, 256, 3, 3), (36,)
    return s
