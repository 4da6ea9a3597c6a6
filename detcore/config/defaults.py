"""Every config key detcore knows, with its default and what it means.

Components read these keys in their `from_config` and get them as plain constructor arguments
(detcore.utils.registry); a key that is not here cannot be set from a yaml file or the command
line. Keys with a closed set of values are checked at merge time against config/choices.py,
and their comments here list exactly those values; so are numeric ranges, the shape of every
list, and finiteness (no number may be NaN or infinite, except SOLVER.CLIP_GRADIENTS.NORM_TYPE
.inf). The defaults are the
published Mask R-CNN R-50-FPN COCO recipe except where a comment says otherwise; the yaml
files in configs/ only list what they change. Names follow detectron2 so its users feel at home.

Conventions: sizes are in pixels of the resized input image, thresholds are IoU in [0, 1],
"per image" counts are per image of the batch, iteration counts are optimizer steps.
"""
from .config import CfgNode as CN

_C = CN()

# Bump when a key changes meaning, so old yaml files can be told apart.
_C.VERSION = 1

_C.MODEL = CN()
# Name of the meta-architecture in the META_ARCH registry: "GeneralizedRCNN" (Faster / Mask
# R-CNN) or "ProposalNetwork" (backbone + RPN only: proposals, scored by their recall).
_C.MODEL.META_ARCHITECTURE = "GeneralizedRCNN"
# torch device the model and batches live on: "cpu", "cuda", "cuda:1", ... (detcore's ops have
# CPU and CUDA kernels only).
_C.MODEL.DEVICE = "cpu"
# Checkpoint (.pth) to initialize from; "" trains from scratch.
_C.MODEL.WEIGHTS = ""
# True: Mask R-CNN (box + mask heads); False: Faster R-CNN (boxes only).
_C.MODEL.MASK_ON = False
# True: Keypoint R-CNN (a keypoint head on the detections; with MASK_ON too, both heads).
_C.MODEL.KEYPOINT_ON = False
# Per-channel mean / std (> 0) subtracted / divided from input pixels, in INPUT.FORMAT channel
# order and 0-255 scale (these are the ImageNet statistics in BGR).
_C.MODEL.PIXEL_MEAN = [103.530, 116.280, 123.675]
_C.MODEL.PIXEL_STD = [57.375, 57.120, 58.395]
# Keep images, feature maps and conv weights in channels-last (NHWC) memory layout: oneDNN's
# CPU convolutions then skip converting layouts around every conv (faster inference and training
# than NCHW: docs/benchmarks.md, "Figures behind code choices"), and GPU tensor cores prefer it too. Same results up to float rounding.
_C.MODEL.CHANNELS_LAST = True
# Reproduce Detectron's and maskrcnn-benchmark's "+1" pixel convention, for their weights: a box
# [x1, x2] there covers x2 - x1 + 1 pixels (detcore's box is [x1, x2 + 1]). Box coding, IoU and NMS
# give the same numbers either way; with True, so do the places where they part: boxes are clipped
# to x1 <= w - 1 (x2 >= 1), ROIAlign gets (x1, y1, x2 - 1, y2 - 1) (with POOLER_ALIGNED False, as
# theirs), masks are pasted into that box, and detections are scaled to the original image as
# their corners are (x2 - 1 scaled, + 1), not clipped there.
_C.MODEL.BOX_LEGACY_PLUS_ONE = False

# ---------------------------------------------------------------------------------------------
# Backbone: a ResNet body and an FPN on top
# ---------------------------------------------------------------------------------------------
_C.MODEL.BACKBONE = CN()
# Backbone name in the BACKBONE registry: "FPN" (ResNet + FPN), "ResNet" (the body alone; with
# RESNETS.OUT_FEATURES ["res4"] the backbone of a C4 model), "RetinaNetFPN" (ResNet + FPN with
# P6/P7 from C5); detectron2's builder names select the same.
_C.MODEL.BACKBONE.NAME = "FPN"
# Stages frozen (no gradient): 0 none, 1 the stem, 2 stem + res2, 3 up to res3, 4 up to res4,
# 5 everything.
_C.MODEL.BACKBONE.FREEZE_AT = 2

_C.MODEL.RESNETS = CN()
# Number of layers: 18 or 34 (basic blocks), 50, 101 or 152 (bottleneck blocks).
_C.MODEL.RESNETS.DEPTH = 50
# Stages whose outputs the backbone returns, among "stem", "res2", "res3", "res4", "res5".
_C.MODEL.RESNETS.OUT_FEATURES = ["res2", "res3", "res4", "res5"]
# Groups of the 3x3 conv in bottleneck blocks: 1 for ResNet, 32 for ResNeXt-32x8d.
_C.MODEL.RESNETS.NUM_GROUPS = 1
# Channels per group in res2's 3x3 conv (64 for ResNet; 8 for ResNeXt-32x8d).
_C.MODEL.RESNETS.WIDTH_PER_GROUP = 64
# Where a bottleneck's stride-2 sits: True on the 1x1 conv (MSRA/caffe2 weights),
# False on the 3x3 conv (torchvision and most PyTorch weights).
_C.MODEL.RESNETS.STRIDE_IN_1X1 = True
# Normalization in the body: "FrozenBN" (fixed pretrained statistics), "BN", "SyncBN",
# "GN" (32 groups), or "" or null (none).
_C.MODEL.RESNETS.NORM = "FrozenBN"
# Output channels of the stem (7x7 conv + max pool).
_C.MODEL.RESNETS.STEM_OUT_CHANNELS = 64
# Output channels of res2; doubles at each later stage. 256 for bottleneck ResNets,
# 64 for R18/R34.
_C.MODEL.RESNETS.RES2_OUT_CHANNELS = 256
# Dilation of the last stage: 1 (output stride 32) or 2 (output stride 16, a larger map).
_C.MODEL.RESNETS.RES5_DILATION = 1
# Deformable 3x3 convs (DCN) in the bottlenecks of each stage res2, res3, res4, res5: four
# bools, e.g. [False, True, True, True] for maskrcnn-benchmark's "dconv c3-c5". Depth >= 50 only.
_C.MODEL.RESNETS.DEFORM_ON_PER_STAGE = [False, False, False, False]
# True: modulated deformable convs (DCN v2, offsets and masks); False: DCN v1 (offsets).
_C.MODEL.RESNETS.DEFORM_MODULATED = False
# Deformable groups (sets of offsets) per deformable conv; >= 1.
_C.MODEL.RESNETS.DEFORM_NUM_GROUPS = 1

_C.MODEL.FPN = CN()
# Backbone body outputs the FPN reads, finest first.
_C.MODEL.FPN.IN_FEATURES = ["res2", "res3", "res4", "res5"]
# Channels of every FPN output (p2 ... p6).
_C.MODEL.FPN.OUT_CHANNELS = 256
# Normalization in the lateral and output convs: "" or null (none), "GN", "BN", "SyncBN",
# "FrozenBN".
_C.MODEL.FPN.NORM = ""
# How the top-down and lateral paths combine: "sum" or "avg".
_C.MODEL.FPN.FUSE_TYPE = "sum"
# Extra coarser levels: "maxpool" (p6 = stride-2 max pool of p5, for Mask R-CNN),
# "p6p7" (p6, p7 from stride-2 convs on C5, RetinaNet as published and in detectron2),
# "p6p7_from_p5" (the same convs on P5, torchvision's retinanet_resnet50_fpn), or "" / "none"
# (no extra level).
_C.MODEL.FPN.TOP_BLOCK = "maxpool"

# ---------------------------------------------------------------------------------------------
# Anchors and the region proposal network
# ---------------------------------------------------------------------------------------------
_C.MODEL.ANCHOR_GENERATOR = CN()
# Anchor generator name in the ANCHOR_GENERATOR registry.
_C.MODEL.ANCHOR_GENERATOR.NAME = "DefaultAnchorGenerator"
# Anchor sizes (sqrt of area, pixels), one list per RPN.IN_FEATURES level (or one list for all).
_C.MODEL.ANCHOR_GENERATOR.SIZES = [[32], [64], [128], [256], [512]]
# Anchor height / width ratios, one list per level (or one list shared by all levels).
_C.MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS = [[0.5, 1.0, 2.0]]
# Anchor centers sit at (i + OFFSET) * stride; 0.0 or 0.5.
_C.MODEL.ANCHOR_GENERATOR.OFFSET = 0.0
# Round the cell anchors' corners to whole pixels (torchvision does; for its checkpoints).
_C.MODEL.ANCHOR_GENERATOR.ROUND_CELL_ANCHORS = False
# Per level and axis, stride = padded image size // feature map size instead of the nominal
# stride (torchvision: an 800 px high input gets stride 61 on its 13-row p6).
_C.MODEL.ANCHOR_GENERATOR.STRIDES_FROM_IMAGE_SIZE = False
# Detectron's generate_anchors (maskrcnn-benchmark, Detectron): a ratio's width and height are
# rounded on a stride x stride box, then scaled to the size (ratio 0.5 of size 32 on stride 4:
# 48 x 24, not 45.25 x 22.6). Their anchors sit at the cell's center: use OFFSET 0.5 with it.
# Exclusive with ROUND_CELL_ANCHORS.
_C.MODEL.ANCHOR_GENERATOR.DETECTRON_CELL_ANCHORS = False
# Order of a location's anchors when a level has several sizes and ratios (RetinaNet):
# "size_major" (all ratios of the first size, then the next size; Detectron, detectron2) or
# "ratio_major" (all sizes of the first ratio, then the next; torchvision).
_C.MODEL.ANCHOR_GENERATOR.CELL_ANCHOR_ORDER = "size_major"

_C.MODEL.PROPOSAL_GENERATOR = CN()
# Proposal generator name in the PROPOSAL_GENERATOR registry.
_C.MODEL.PROPOSAL_GENERATOR.NAME = "RPN"

_C.MODEL.RPN = CN()
# RPN head name in the RPN_HEAD registry.
_C.MODEL.RPN.HEAD_NAME = "StandardRPNHead"
# Feature maps the RPN runs on; one anchor size list each.
_C.MODEL.RPN.IN_FEATURES = ["p2", "p3", "p4", "p5", "p6"]
# Anchors crossing the image border by more than this many pixels are ignored in
# training; -1 keeps them all.
_C.MODEL.RPN.BOUNDARY_THRESH = -1
# IoU cut points of the anchor matcher and the label of each band: IoU < 0.3 -> 0
# (background), 0.3..0.7 -> -1 (ignored), >= 0.7 -> 1 (foreground).
_C.MODEL.RPN.IOU_THRESHOLDS = [0.3, 0.7]
_C.MODEL.RPN.IOU_LABELS = [0, -1, 1]
# Also make each ground-truth box's best anchor(s) foreground even below 0.7 IoU.
_C.MODEL.RPN.ALLOW_LOW_QUALITY_MATCHES = True
# Anchors sampled per image for the RPN losses.
_C.MODEL.RPN.BATCH_SIZE_PER_IMAGE = 256
# Target fraction of foreground anchors in that sample.
_C.MODEL.RPN.POSITIVE_FRACTION = 0.5
# Box regression loss: "smooth_l1" or "l1" on the deltas, or "giou" on the decoded boxes.
_C.MODEL.RPN.BBOX_REG_LOSS_TYPE = "smooth_l1"
# Weights (wx, wy, ww, wh) of the anchor -> box delta encoding.
_C.MODEL.RPN.BBOX_REG_WEIGHTS = (1.0, 1.0, 1.0, 1.0)
# Smooth L1 transition point; 0.0 makes it plain L1.
_C.MODEL.RPN.SMOOTH_L1_BETA = 0.0
# Multiplier of both RPN losses.
_C.MODEL.RPN.LOSS_WEIGHT = 1.0
# Both RPN losses are divided by "batch_size" (BATCH_SIZE_PER_IMAGE x images, Detectron) or
# by "num_sampled" (the anchors actually sampled, torchvision).
_C.MODEL.RPN.LOSS_NORMALIZER = "batch_size"
# Top-scoring anchors kept per feature level before NMS, in training / at test.
_C.MODEL.RPN.PRE_NMS_TOPK_TRAIN = 2000
_C.MODEL.RPN.PRE_NMS_TOPK_TEST = 1000
# Proposals kept per image after NMS (over all levels), in training / at test.
_C.MODEL.RPN.POST_NMS_TOPK_TRAIN = 2000
_C.MODEL.RPN.POST_NMS_TOPK_TEST = 1000
# IoU threshold of the proposal NMS.
_C.MODEL.RPN.NMS_THRESH = 0.7
# Proposals with a side shorter than this (pixels) are dropped.
_C.MODEL.RPN.MIN_SIZE = 0.0
# What orders the proposals for the NMS and the per-image top-k (the per-level top-k always
# takes the largest logits): "logit" (the objectness logit; detectron2), "sigmoid" (its float32
# probability, where saturated logits tie at 1.0 and ties keep the per-level order: p2 first,
# then by logit; maskrcnn-benchmark, Detectron), or "torchvision" (the probability, with ties in
# the order torchvision's batched_nms leaves them, for its checkpoints).
_C.MODEL.RPN.PROPOSAL_RANKING = "logit"

# ---------------------------------------------------------------------------------------------
# ROI heads: box classification / regression and masks on the proposals
# ---------------------------------------------------------------------------------------------
_C.MODEL.ROI_HEADS = CN()
# ROI heads name in the ROI_HEADS registry: "StandardROIHeads" (box head and mask head on FPN
# levels) or "Res5ROIHeads" (C4: ResNet's res5 per ROI on one feature map, shared by boxes and
# masks; it uses ROI_BOX_HEAD's pooler settings for both, and no ROI_BOX_HEAD.NAME head).
_C.MODEL.ROI_HEADS.NAME = "StandardROIHeads"
# Foreground classes; background is implicit (class index NUM_CLASSES).
_C.MODEL.ROI_HEADS.NUM_CLASSES = 80
# Feature maps the ROI poolers read, finest first (p6 only serves the RPN).
_C.MODEL.ROI_HEADS.IN_FEATURES = ["p2", "p3", "p4", "p5"]
# Proposal matcher: IoU < 0.5 -> background (0), >= 0.5 -> foreground (1).
_C.MODEL.ROI_HEADS.IOU_THRESHOLDS = [0.5]
_C.MODEL.ROI_HEADS.IOU_LABELS = [0, 1]
# Proposals sampled per image to train the box head.
_C.MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE = 512
# Target fraction of foreground proposals in that sample.
_C.MODEL.ROI_HEADS.POSITIVE_FRACTION = 0.25
# At test: detections scoring below this are dropped before NMS.
_C.MODEL.ROI_HEADS.SCORE_THRESH_TEST = 0.05
# At test: IoU threshold of the per-class NMS.
_C.MODEL.ROI_HEADS.NMS_THRESH_TEST = 0.5
# In training, add the ground-truth boxes to the proposals (gives early training positives).
_C.MODEL.ROI_HEADS.PROPOSAL_APPEND_GT = True
# FPN level assignment: a box of sqrt(area) CANONICAL_BOX_SIZE pixels is pooled from
# level CANONICAL_LEVEL (p4); each halving / doubling moves one level down / up.
_C.MODEL.ROI_HEADS.CANONICAL_BOX_SIZE = 224
_C.MODEL.ROI_HEADS.CANONICAL_LEVEL = 4
# Level rule's eps: "detectron2" floor(k0 + log2(s / s0 + 1e-8)), "torchvision"
# floor(k0 + log2(s / s0) + 1e-6) or "maskrcnn_benchmark" floor(k0 + log2(s / s0 + 1e-6))
# (s = sqrt(box area)).
_C.MODEL.ROI_HEADS.LEVEL_MAPPER = "detectron2"
# At test: detections with a side shorter than this (pixels) are dropped before NMS; 0 keeps
# all (torchvision uses 0.01).
_C.MODEL.ROI_HEADS.MIN_BOX_SIZE_TEST = 0.0

_C.MODEL.ROI_BOX_HEAD = CN()
# Box head name in the ROI_BOX_HEAD registry.
_C.MODEL.ROI_BOX_HEAD.NAME = "FastRCNNConvFCHead"
# Predictor (class scores + box deltas) name in the ROI_BOX_PREDICTOR registry.
_C.MODEL.ROI_BOX_HEAD.PREDICTOR_NAME = "FastRCNNOutputLayers"
# 3x3 convs before the FC layers, and their channels.
_C.MODEL.ROI_BOX_HEAD.NUM_CONV = 0
_C.MODEL.ROI_BOX_HEAD.CONV_DIM = 256
# Fully connected layers, and their width.
_C.MODEL.ROI_BOX_HEAD.NUM_FC = 2
_C.MODEL.ROI_BOX_HEAD.FC_DIM = 1024
# Normalization of the convs: "" or null (none), "GN", "BN", "SyncBN", "FrozenBN".
_C.MODEL.ROI_BOX_HEAD.NORM = ""
# Side of the pooled feature (7 -> 7x7 per ROI).
_C.MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION = 7
# ROIAlign samples per bin side; 0 = adaptive (ceil(roi size / output size)).
_C.MODEL.ROI_BOX_HEAD.POOLER_SAMPLING_RATIO = 0
# ROIAlign aligned=True: half-pixel shift so box edges land on pixel borders.
_C.MODEL.ROI_BOX_HEAD.POOLER_ALIGNED = True
# Weights (wx, wy, ww, wh) of the proposal -> box delta encoding.
_C.MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS = (10.0, 10.0, 5.0, 5.0)
# True: one box regression for all classes; False: one per class.
_C.MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG = False
# Box regression loss: "smooth_l1" or "l1" on the deltas, or "giou" on the decoded boxes.
_C.MODEL.ROI_BOX_HEAD.BBOX_REG_LOSS_TYPE = "smooth_l1"
# Smooth L1 transition point; 0.0 makes it plain L1.
_C.MODEL.ROI_BOX_HEAD.SMOOTH_L1_BETA = 0.0

_C.MODEL.ROI_MASK_HEAD = CN()
# Mask head name in the ROI_MASK_HEAD registry.
_C.MODEL.ROI_MASK_HEAD.NAME = "MaskRCNNConvUpsampleHead"
# 3x3 convs before the 2x deconv, and their channels (4 x 256 -> 28x28 masks; C4 models: 0,
# a deconv on res5's output).
_C.MODEL.ROI_MASK_HEAD.NUM_CONV = 4
_C.MODEL.ROI_MASK_HEAD.CONV_DIM = 256
# Normalization of the convs: "" or null (none), "GN", "BN", "SyncBN", "FrozenBN".
_C.MODEL.ROI_MASK_HEAD.NORM = ""
# True: one mask for all classes; False: one mask per class (the box's class is used).
_C.MODEL.ROI_MASK_HEAD.CLS_AGNOSTIC_MASK = False
# Side of the pooled feature; masks come out at twice this (14 -> 28x28).
_C.MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION = 14
# ROIAlign samples per bin side; 0 = adaptive.
_C.MODEL.ROI_MASK_HEAD.POOLER_SAMPLING_RATIO = 0
# ROIAlign aligned=True (see ROI_BOX_HEAD.POOLER_ALIGNED).
_C.MODEL.ROI_MASK_HEAD.POOLER_ALIGNED = True
# Mask training targets: "aligned" (GT sampled at the M x M cell centers of the ROI,
# thresholded at 0.5) or "torchvision" (ROIAlign aligned=False of the GT bitmap, soft).
_C.MODEL.ROI_MASK_HEAD.TARGET_MODE = "aligned"
# How masks are pasted into the image at test: "aligned" (bilinear at pixel centres, the inverse
# of the training targets' crop) or "torchvision" (torchvision's padded, integer-box resize).
_C.MODEL.ROI_MASK_HEAD.PASTE_MODE = "aligned"
# Pasted mask probabilities >= this become foreground pixels.
_C.MODEL.ROI_MASK_HEAD.MASK_THRESHOLD = 0.5

_C.MODEL.ROI_KEYPOINT_HEAD = CN()
# Keypoint head name in the ROI_KEYPOINT_HEAD registry.
_C.MODEL.ROI_KEYPOINT_HEAD.NAME = "KRCNNConvDeconvUpsampleHead"
# K, keypoints per instance (17 for COCO persons); the dataset's keypoint_names must have K names.
_C.MODEL.ROI_KEYPOINT_HEAD.NUM_KEYPOINTS = 17
# Output channels of the 3x3 convs (each + ReLU) before the deconv: 8 x 512 in the paper.
_C.MODEL.ROI_KEYPOINT_HEAD.CONV_DIMS = [512] * 8
# Side of the pooled feature; heatmaps come out at four times this (14 -> 56x56).
_C.MODEL.ROI_KEYPOINT_HEAD.POOLER_RESOLUTION = 14
# ROIAlign samples per bin side; 0 = adaptive.
_C.MODEL.ROI_KEYPOINT_HEAD.POOLER_SAMPLING_RATIO = 0
# ROIAlign aligned=True (see ROI_BOX_HEAD.POOLER_ALIGNED).
_C.MODEL.ROI_KEYPOINT_HEAD.POOLER_ALIGNED = True
# True: the loss is the mean over the batch's labeled keypoints inside their ROIs. False: the
# published Detectron normalization, the sum divided by what a full batch could hold
# (images x NUM_KEYPOINTS x ROI_HEADS.BATCH_SIZE_PER_IMAGE x POSITIVE_FRACTION), so batches with
# few points are not up-weighted; use LOSS_WEIGHT 4.0 with it.
_C.MODEL.ROI_KEYPOINT_HEAD.NORMALIZE_LOSS_BY_VISIBLE_KEYPOINTS = True
# Multiplier of the keypoint loss.
_C.MODEL.ROI_KEYPOINT_HEAD.LOSS_WEIGHT = 1.0

# ---------------------------------------------------------------------------------------------
# RetinaNet (MODEL.META_ARCHITECTURE "RetinaNet"): a dense head on the FPN levels, focal loss
# ---------------------------------------------------------------------------------------------
_C.MODEL.RETINANET = CN()
# Foreground classes; each has its own sigmoid output (no background class).
_C.MODEL.RETINANET.NUM_CLASSES = 80
# Feature maps the head runs on, finest first; one anchor size list each.
_C.MODEL.RETINANET.IN_FEATURES = ["p3", "p4", "p5", "p6", "p7"]
# 3x3 conv + ReLU layers in each of the two towers (class and box), shared by all levels.
_C.MODEL.RETINANET.NUM_CONVS = 4
# Normalization after each tower conv: "" or null (none), or "GN" (32 groups).
_C.MODEL.RETINANET.NORM = ""
# Foreground probability every class starts at (sets the classification bias).
_C.MODEL.RETINANET.PRIOR_PROB = 0.01
# Anchor matcher: IoU < 0.4 -> background (0), 0.4..0.5 -> ignored (-1), >= 0.5 -> foreground (1).
_C.MODEL.RETINANET.IOU_THRESHOLDS = [0.4, 0.5]
_C.MODEL.RETINANET.IOU_LABELS = [0, -1, 1]
# Also make each ground-truth box's best anchor(s) foreground even below 0.5 IoU.
_C.MODEL.RETINANET.ALLOW_LOW_QUALITY_MATCHES = True
# Focal loss: alpha weighs the foreground term (1 - alpha the background), gamma >= 0 focuses
# on hard examples.
_C.MODEL.RETINANET.FOCAL_LOSS_ALPHA = 0.25
_C.MODEL.RETINANET.FOCAL_LOSS_GAMMA = 2.0
# Weights (wx, wy, ww, wh) of the anchor -> box delta encoding.
_C.MODEL.RETINANET.BBOX_REG_WEIGHTS = (1.0, 1.0, 1.0, 1.0)
# Box regression loss: "smooth_l1" or "l1" on the deltas, or "giou" on the decoded boxes.
_C.MODEL.RETINANET.BBOX_REG_LOSS_TYPE = "smooth_l1"
# Smooth L1 transition point (Detectron's 0.11); 0.0 makes it plain L1 (detectron2's recipe).
_C.MODEL.RETINANET.SMOOTH_L1_LOSS_BETA = 0.11
# What both losses are divided by: "num_foreground" (the batch's foreground anchors, at least 1;
# the paper), "moving_average" (the same count smoothed over iterations with momentum 0.9 from
# 100, detectron2) or "per_image" (each image's loss by its own foreground anchors, then the mean
# over images, torchvision).
_C.MODEL.RETINANET.LOSS_NORMALIZER = "num_foreground"
# At test: per level, the TOPK_CANDIDATES_TEST best (anchor, class) scores above
# SCORE_THRESH_TEST are decoded; then a per-class NMS at NMS_THRESH_TEST over all levels, and
# TEST.DETECTIONS_PER_IMAGE kept.
_C.MODEL.RETINANET.SCORE_THRESH_TEST = 0.05
_C.MODEL.RETINANET.TOPK_CANDIDATES_TEST = 1000
_C.MODEL.RETINANET.NMS_THRESH_TEST = 0.5
# At test: clip boxes to the image before the NMS (torchvision, maskrcnn-benchmark) rather than
# after it (detectron2); IoUs of boxes crossing the border differ.
_C.MODEL.RETINANET.CLIP_BEFORE_NMS = False

# ---------------------------------------------------------------------------------------------
# Input: resizing, flipping, batching
# ---------------------------------------------------------------------------------------------
_C.INPUT = CN()
# Training short side(s), pixels; one is drawn per image (see MIN_SIZE_TRAIN_SAMPLING).
_C.INPUT.MIN_SIZE_TRAIN = (800,)
# "choice": pick one of MIN_SIZE_TRAIN; "range": uniform in [MIN_SIZE_TRAIN[0], [1]].
_C.INPUT.MIN_SIZE_TRAIN_SAMPLING = "choice"
# Training long side cap, pixels (the short side shrinks to respect it).
_C.INPUT.MAX_SIZE_TRAIN = 1333
# Test short side and long side cap, pixels; MIN_SIZE_TEST 0 disables resizing.
_C.INPUT.MIN_SIZE_TEST = 800
_C.INPUT.MAX_SIZE_TEST = 1333
# How images are resized, in training and at test (the weights of another library expect its
# pixels): "opencv" (cv2 bilinear of the uint8 image; sizes rounded, int(side * scale + 0.5)),
# "torchvision" (GeneralizedRCNNTransform: bilinear interpolate of the float image, no rounding
# to uint8, no antialiasing; sizes truncated, int(side * scale); masks by nearest neighbour), or
# "maskrcnn_benchmark" (PIL bilinear of the uint8 image, antialiased when shrinking; its size rule:
# the long side's cap rounds the short side, the other side is truncated).
_C.INPUT.RESIZE_MODE = "opencv"
# Channel order the model sees: "BGR" or "RGB" (PIXEL_MEAN/STD follow it).
_C.INPUT.FORMAT = "BGR"
# How instance masks are carried through the data pipeline: "polygon" or "bitmask".
_C.INPUT.MASK_FORMAT = "polygon"
# Training flip augmentation: "none", "horizontal" or "vertical" (probability 0.5).
_C.INPUT.RANDOM_FLIP = "horizontal"
# Batched images are zero-padded to a multiple of this (32 = the coarsest FPN stride
# before p6; C4 models need none); 0 pads only to the largest image.
_C.INPUT.SIZE_DIVISIBILITY = 32

# Training augmentation beyond resize and flip; everything below is off by default, and a config
# that leaves it off gets exactly the pipeline it had before (same images for the same seed).
# Order of the training pipeline: crop, resize (or large-scale jitter), flip, colour.
_C.INPUT.COLOR_JITTER = CN()
# Each draws a factor uniformly in [1 - v, 1 + v] per image, v in [0, 1], 0 = off: brightness
# scales the pixels, contrast blends with the image's mean grey, saturation with each pixel's grey.
_C.INPUT.COLOR_JITTER.BRIGHTNESS = 0.0
_C.INPUT.COLOR_JITTER.CONTRAST = 0.0
_C.INPUT.COLOR_JITTER.SATURATION = 0.0
# Standard deviation of AlexNet's PCA lighting noise (ImageNet eigenvalues for 0..255 pixels;
# AlexNet used 0.1), >= 0, 0 = off. detectron2's RandomLighting with the same scale is ~255x weaker.
_C.INPUT.COLOR_JITTER.LIGHTING = 0.0

_C.INPUT.CROP = CN()
# Random crop of the image (before resizing), as detectron2's INPUT.CROP. Instances left outside
# are dropped, boxes and polygons clipped to the crop; with MODEL.MASK_ON the boxes become the
# boxes of the clipped masks. A crop keeping no instance trains as background, as in detectron2.
_C.INPUT.CROP.ENABLED = False
# "relative": SIZE is (h, w) fractions of the image; "relative_range": fractions drawn in [SIZE, 1];
# "absolute": SIZE is (h, w) pixels (capped at the image); "absolute_range": each side drawn in
# [SIZE[0], SIZE[1]] pixels.
_C.INPUT.CROP.TYPE = "relative_range"
_C.INPUT.CROP.SIZE = (0.9, 0.9)

_C.INPUT.LARGE_SCALE_JITTER = CN()
# Large-scale jitter (LSJ) instead of MIN_SIZE_TRAIN / MAX_SIZE_TRAIN: resize to fit
# scale * OUTPUT_SIZE with scale uniform in SCALE_RANGE, then crop at a random place / pad at the
# bottom-right (with MODEL.PIXEL_MEAN, which the model normalizes to 0 as its own padding) to
# exactly OUTPUT_SIZE. Test images keep INPUT.MIN_SIZE_TEST / MAX_SIZE_TEST (set them to fit
# OUTPUT_SIZE). With MODEL.MASK_ON the boxes become the boxes of the clipped masks.
_C.INPUT.LARGE_SCALE_JITTER.ENABLED = False
# (height, width) of every training image, pixels.
_C.INPUT.LARGE_SCALE_JITTER.OUTPUT_SIZE = (1024, 1024)
# (min, max) scale of OUTPUT_SIZE the image is resized to fit; the LSJ paper uses (0.1, 2.0).
_C.INPUT.LARGE_SCALE_JITTER.SCALE_RANGE = (0.1, 2.0)

# ---------------------------------------------------------------------------------------------
# Datasets and loading
# ---------------------------------------------------------------------------------------------
_C.DATASETS = CN()
# Registered dataset names to train on / evaluate on.
_C.DATASETS.TRAIN = ("shapes_train",)
_C.DATASETS.TEST = ("shapes_val",)
# Folder holding the datasets; "" means $DETCORE_DATASETS, else ./datasets.
_C.DATASETS.ROOT = ""

_C.DATALOADER = CN()
# Data loading worker processes; 0 loads in the main process.
_C.DATALOADER.NUM_WORKERS = 2
# Batch wide images with wide ones and tall with tall (less padding).
_C.DATALOADER.ASPECT_RATIO_GROUPING = True
# Drop training images without any annotation.
_C.DATALOADER.FILTER_EMPTY_ANNOTATIONS = True
# With MODEL.KEYPOINT_ON, drop training images with fewer labeled keypoints (v > 0, all
# instances together) than this; 0 keeps them all.
_C.DATALOADER.MIN_KEYPOINTS_PER_IMAGE = 1
# Training sampler name: "TrainingSampler" (infinite shuffled stream).
_C.DATALOADER.SAMPLER_TRAIN = "TrainingSampler"

# ---------------------------------------------------------------------------------------------
# Solver: SGD, LR schedule, checkpoints
# ---------------------------------------------------------------------------------------------
_C.SOLVER = CN()
# Images per optimizer step, summed over all processes / GPUs.
_C.SOLVER.IMS_PER_BATCH = 16
# Learning rate for IMS_PER_BATCH images (linear scaling: halve both together).
_C.SOLVER.BASE_LR = 0.02
# SGD momentum, and whether to use Nesterov momentum.
_C.SOLVER.MOMENTUM = 0.9
_C.SOLVER.NESTEROV = False
# L2 weight decay of weights, and of normalization layers' scale / shift.
_C.SOLVER.WEIGHT_DECAY = 0.0001
_C.SOLVER.WEIGHT_DECAY_NORM = 0.0
# Learning rate multiplier for bias parameters.
_C.SOLVER.BIAS_LR_FACTOR = 1.0
# Training length, in iterations (optimizer steps).
_C.SOLVER.MAX_ITER = 90000
# Iterations at which the LR is multiplied by GAMMA (>= 1, strictly increasing).
_C.SOLVER.STEPS = (60000, 80000)
_C.SOLVER.GAMMA = 0.1
# LR schedule name: "WarmupMultiStepLR" or "WarmupCosineLR".
_C.SOLVER.LR_SCHEDULER_NAME = "WarmupMultiStepLR"
# Warmup: the LR starts at BASE_LR * WARMUP_FACTOR and reaches BASE_LR after
# WARMUP_ITERS iterations, "linear"ly or "constant" (jumps at the end).
_C.SOLVER.WARMUP_FACTOR = 0.001
_C.SOLVER.WARMUP_ITERS = 1000
_C.SOLVER.WARMUP_METHOD = "linear"
# Save a checkpoint every this many iterations (and at the end).
_C.SOLVER.CHECKPOINT_PERIOD = 5000

# When training is called diverged (detcore/engine/divergence.py): it stops, and no checkpoint
# keeps the diverged weights. Besides any NaN / inf loss, gradient or weight, two rules
# relative to the run's start; 0 turns a rule off.
_C.SOLVER.DIVERGENCE = CN()
# A total loss more than this many times the run's first one.
_C.SOLVER.DIVERGENCE.MAX_LOSS_GROWTH = 100.0
# Weights whose L2 norm is more than this many times their norm when the run started
# (checked before each checkpoint).
_C.SOLVER.DIVERGENCE.MAX_WEIGHT_GROWTH = 10.0

_C.SOLVER.CLIP_GRADIENTS = CN()
# Gradient clipping before each step.
_C.SOLVER.CLIP_GRADIENTS.ENABLED = False
# "norm": clip the gradient norm of all parameters together; "value": clip each element.
_C.SOLVER.CLIP_GRADIENTS.CLIP_TYPE = "norm"
# Maximum norm (CLIP_TYPE "norm") or absolute value ("value").
_C.SOLVER.CLIP_GRADIENTS.CLIP_VALUE = 1.0
# p of the p-norm for CLIP_TYPE "norm": 2.0 is Euclidean, .inf (yaml) the max norm.
_C.SOLVER.CLIP_GRADIENTS.NORM_TYPE = 2.0

_C.SOLVER.AMP = CN()
# Mixed precision training with torch.autocast (and a grad scaler for float16).
_C.SOLVER.AMP.ENABLED = False
# Autocast dtype: "float16" (CUDA) or "bfloat16" (CPU, or CUDA without a scaler).
_C.SOLVER.AMP.DTYPE = "float16"

# ---------------------------------------------------------------------------------------------
# Test / evaluation
# ---------------------------------------------------------------------------------------------
_C.TEST = CN()
# Detections kept per image after NMS (highest scores).
_C.TEST.DETECTIONS_PER_IMAGE = 100
# Evaluate on DATASETS.TEST every this many iterations during training; 0 = only at the end.
_C.TEST.EVAL_PERIOD = 0
# Images per inference batch (per process) in evaluation; >= 1. Images of a batch are padded to
# the largest of them; detections do not depend on it beyond float rounding.
_C.TEST.IMS_PER_BATCH = 1
# Precision of inference (Predictor, evaluation, the demo, export): "float32", or "bfloat16"
# (the network under torch.autocast; box decoding, scores, NMS and mask pasting stay float32).
# bfloat16 pays on CPUs with native support (AMX or AVX512-BF16; `python -m
# detcore.utils.collect_env` says) and on CUDA GPUs from Ampere on; elsewhere it is emulated and slow.
_C.TEST.PRECISION = "float32"
# Draw pictures of each COCO-style evaluation next to its coco_eval_metrics.json (per-class
# precision-recall curves, per-category AP bars, a confusion matrix, a gallery of the images with
# the most errors; see detcore/evaluation/pictures.py). False: only the numbers.
_C.TEST.EVAL_PICTURES = True

_C.TEST.AUG = CN()
# Test-time augmentation in evaluation (tools/test_net.py and the trainer): every short side of
# MIN_SIZES (long side capped at MAX_SIZE), each also flipped horizontally with FLIP; detections
# mapped back to the image and merged, mask probabilities averaged over all the augmentations.
# The test loader then hands over the images unresized (INPUT.MIN_SIZE_TEST is not used), and the
# results go to OUTPUT_DIR/inference/<dataset>_TTA.
_C.TEST.AUG.ENABLED = False
# Short sides to run, pixels (0: the image as it is), and the long side cap of all of them.
_C.TEST.AUG.MIN_SIZES = (400, 500, 600, 700, 800, 900, 1000, 1100, 1200)
_C.TEST.AUG.MAX_SIZE = 4000
# Also run every scale flipped horizontally.
_C.TEST.AUG.FLIP = True
# How the detections of all augmentations are merged: "nms" (per-class NMS at
# MODEL.ROI_HEADS.NMS_THRESH_TEST, as detectron2) or "box_voting" (the same NMS, then each kept box
# becomes the score-weighted mean of the same-class boxes overlapping it by BOX_VOTING_IOU or more,
# as Detectron's TEST.BBOX_VOTE).
_C.TEST.AUG.MERGE = "nms"
_C.TEST.AUG.BOX_VOTING_IOU = 0.8

# ---------------------------------------------------------------------------------------------
# Misc
# ---------------------------------------------------------------------------------------------
# Folder for checkpoints, logs, metrics and the dumped config.
_C.OUTPUT_DIR = "./output"
# Random seed; negative draws a fresh one (and logs it).
_C.SEED = -1
# Log training metrics every this many iterations.
_C.LOG_PERIOD = 20


def get_cfg():
    """A fresh, mutable copy of the defaults; changing it never touches the defaults."""
    return _C.clone()
