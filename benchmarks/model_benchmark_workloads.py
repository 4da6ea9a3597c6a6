"""What benchmarks/benchmark_model.py measures, and the worker process that measures it.

The shared inputs (a smooth random image, polygon targets), detcore's and torchvision's Mask R-CNN
or RetinaNet R50-FPN behind one small interface (a runner per framework), the timed inference and
training step, and the two measurements a worker makes on request (benchmark_worker.py's
protocol): the times of every framework alternating run by run, or the peak memory of a single
(framework, phase). The entry script starts a worker as itself with ``--worker``; the method is
documented there.
"""
import resource
import sys

import numpy as np
import torch

import benchmark_worker
from benchmark_timing import median, timed_ms

NUM_GT = 6  # objects per training image
# Inference stages per model, each timed on its own (the calls the models' forward makes).
STAGES = {
    "mask_rcnn": ("preprocess", "backbone", "rpn", "roi_heads", "postprocess"),
    # head: anchors and the class / box towers on every level; detect: per level top-k, decoding, NMS.
    "retinanet": ("preprocess", "backbone", "head", "detect", "postprocess"),
}
# detcore's config per model: the one that computes what torchvision's model computes.
CONFIGS = {
    "mask_rcnn": "configs/e2e_mask_rcnn_R_50_FPN_1x.yaml",
    "retinanet": "configs/torchvision/retinanet_R_50_FPN.yaml",  # P6/P7 from P5, as torchvision's
}


# --- shared inputs ----------------------------------------------------------------------------------
def make_image(h, w, seed):
    """A smooth random BGR uint8 image (random noise would be an unusual input for a detector)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(max(h // 16, 2), max(w // 16, 2), 3)).astype(np.float32)
    t = torch.from_numpy(small).permute(2, 0, 1)[None]
    big = torch.nn.functional.interpolate(t, size=(h, w), mode="bilinear", align_corners=False)[0]
    return big.round().clamp(0, 255).to(torch.uint8)  # [3, H, W], BGR by convention


def make_targets(h, w, num_classes, seed):
    """NUM_GT boxes with an octagon polygon inscribed in each, and class ids in [0, num_classes)."""
    rng = np.random.default_rng(seed)
    boxes, polygons = [], []
    for _ in range(NUM_GT):
        bw, bh = rng.uniform(0.05, 0.4) * w, rng.uniform(0.05, 0.4) * h
        x1, y1 = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
        cx, cy = x1 + bw / 2, y1 + bh / 2
        angles = np.arange(8) * np.pi / 4
        poly = np.stack([cx + bw / 2 * np.cos(angles), cy + bh / 2 * np.sin(angles)], axis=1)
        boxes.append([poly[:, 0].min(), poly[:, 1].min(), poly[:, 0].max(), poly[:, 1].max()])
        polygons.append(poly.reshape(-1))
    classes = rng.integers(0, num_classes, size=NUM_GT)
    return np.array(boxes, dtype=np.float32), polygons, classes


# --- the two models, each behind the same small interface --------------------------------------------
def detcore_cfg(args):
    from detcore.config import get_cfg

    cfg = get_cfg()
    cfg.merge_from_file(args.config)
    cfg.merge_from_list(["MODEL.DEVICE", args.device, "MODEL.WEIGHTS", "", "TEST.DETECTIONS_PER_IMAGE", args.detections])
    if args.model == "retinanet":
        cfg.merge_from_list(["MODEL.RETINANET.SCORE_THRESH_TEST", 0.0])
    else:
        cfg.merge_from_list(
            [
                "MODEL.ROI_HEADS.SCORE_THRESH_TEST", 0.0,
                "MODEL.RPN.POST_NMS_TOPK_TEST", args.proposals,
                "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE", args.roi_batch,
            ]
        )
    cfg.merge_from_list(list(args.opts))  # the command line's KEY VALUE pairs, last so that they win
    return cfg


def num_classes(cfg):
    return cfg.MODEL.RETINANET.NUM_CLASSES if cfg.MODEL.META_ARCHITECTURE == "RetinaNet" else cfg.MODEL.ROI_HEADS.NUM_CLASSES


class DetcoreRunner:
    """detcore's model in TEST.PRECISION float32."""

    name = "detcore"
    precision = "float32"

    def __init__(self, args, train):
        from detcore.modeling import build_model
        from detcore.utils.precision import inference_autocast

        self.autocast = lambda: inference_autocast(self.precision, self.device)
        self.cfg = detcore_cfg(args)
        self.device = torch.device(args.device)
        torch.manual_seed(0)  # both precisions get the same random weights
        self.model = build_model(self.cfg)
        self.model.train(train)
        self.num_classes = num_classes(self.cfg)
        self.retinanet = args.model == "retinanet"

    def inference_inputs(self, image):
        return [{"image": image.to(self.device), "height": image.shape[1], "width": image.shape[2]}]

    def stages(self, inputs):
        """The model's inference, split into its stages (the same calls its inference makes)."""
        if self.retinanet:
            return self._retinanet_stages(inputs)
        m = self.model
        state = {}

        def preprocess():
            state["images"] = m.preprocess_image(inputs)

        def backbone():
            state["features"] = m.backbone(state["images"].tensor)

        def rpn():
            state["proposals"], _ = m.proposal_generator(state["images"], state["features"], None)

        def roi_heads():
            state["results"], _ = m.roi_heads(state["images"], state["features"], state["proposals"], None)

        def postprocess():
            state["output"] = m.postprocess(state["results"], inputs)

        return state, self._in_precision(dict(zip(STAGES["mask_rcnn"], (preprocess, backbone, rpn, roi_heads, postprocess))))

    def _in_precision(self, stages):
        """Each stage run under the runner's precision, as Predictor and inference_on_dataset run the model."""

        def wrap(stage):
            def run():
                with self.autocast():
                    stage()

            return run

        return {name: wrap(stage) for name, stage in stages.items()}

    def _retinanet_stages(self, inputs):
        m = self.model
        state = {}

        def preprocess():
            state["images"] = m.preprocess_image(inputs)

        def backbone():
            state["features"] = m.backbone(state["images"].tensor)

        def head():
            state["anchors"], state["logits"], state["deltas"] = m.predict(state["images"], state["features"])

        def detect():
            state["results"] = m.detect(state["images"], state["anchors"], state["logits"], state["deltas"])

        def postprocess():
            state["output"] = m.postprocess(state["results"], inputs)

        return state, self._in_precision(dict(zip(STAGES["retinanet"], (preprocess, backbone, head, detect, postprocess))))

    def counts(self, state):
        """(proposals or anchors, detections) of the first image."""
        first = sum(len(a) for a in state["anchors"]) if self.retinanet else len(state["proposals"][0])
        return first, len(state["output"][0]["instances"])

    def train_inputs(self, images, targets):
        from detcore.structures import Boxes, Instances, PolygonMasks

        inputs = []
        for image, (boxes, polygons, classes) in zip(images, targets):
            h, w = image.shape[1:]
            inst = Instances(
                (h, w),
                gt_boxes=Boxes(torch.from_numpy(boxes)),
                gt_classes=torch.from_numpy(classes).long(),
                gt_masks=PolygonMasks([[p] for p in polygons]),
            )
            inputs.append({"image": image.to(self.device), "height": h, "width": w, "instances": inst})
        return inputs

    def train_forward(self, inputs):
        # The forward under autocast as SimpleTrainer does with SOLVER.AMP (bfloat16: no grad scaler).
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bfloat16"):
            return sum(self.model(inputs).values())


class DetcoreBfloat16Runner(DetcoreRunner):
    """The same model with TEST.PRECISION bfloat16 for inference and bfloat16 AMP
    (SOLVER.AMP.ENABLED, DTYPE bfloat16) for the training step."""

    name = "detcore_bfloat16"
    precision = "bfloat16"


class TorchvisionRunner:
    name = "torchvision"

    def __init__(self, args, train):
        from torchvision.models.detection import MaskRCNN, RetinaNet
        from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor, resnet_fpn_backbone
        from torchvision.models.resnet import resnet50
        from torchvision.ops import FrozenBatchNorm2d
        from torchvision.ops.feature_pyramid_network import LastLevelP6P7

        cfg = detcore_cfg(args)  # the class count and input size follow detcore's config
        self.device = torch.device(args.device)
        self.num_classes = num_classes(cfg)
        self.retinanet = args.model == "retinanet"
        h, w = args.height, args.width
        # min_size / max_size: the image is already at its test size, so no resizing.
        if self.retinanet:
            # What retinanet_resnet50_fpn builds for a pretrained body (FrozenBN, 3 trainable
            # stages); with weights=None it would switch to BatchNorm and 5 stages.
            body = resnet50(weights=None, norm_layer=FrozenBatchNorm2d)
            backbone = _resnet_fpn_extractor(body, 3, returned_layers=[2, 3, 4], extra_blocks=LastLevelP6P7(256, 256))
            self.model = RetinaNet(
                backbone,
                num_classes=self.num_classes + 1,  # + its "class 0"
                min_size=min(h, w),
                max_size=max(h, w),
                score_thresh=0.0,
                detections_per_img=args.detections,
            ).to(self.device)
        else:
            backbone = resnet_fpn_backbone(
                backbone_name="resnet50", weights=None, norm_layer=FrozenBatchNorm2d, trainable_layers=3
            )
            self.model = MaskRCNN(
                backbone,
                num_classes=self.num_classes + 1,  # + background
                min_size=min(h, w),
                max_size=max(h, w),
                box_score_thresh=0.0,
                box_detections_per_img=args.detections,
                rpn_post_nms_top_n_test=args.proposals,
                box_batch_size_per_image=args.roi_batch,
            ).to(self.device)
        if args.torchvision_channels_last:
            # NHWC weights are enough: a conv with NHWC weights gives NHWC outputs, so the layout
            # spreads from the first conv on.
            self.model.to(memory_format=torch.channels_last)
        self.model.train(train)

    def _to_rgb_float(self, image):
        # torchvision's convention: RGB floats in [0, 1] (the data loader's ToTensor; not timed).
        return image.flip(0).float().div(255).to(self.device)

    def inference_inputs(self, image):
        return [self._to_rgb_float(image)]

    def stages(self, inputs):
        if self.retinanet:
            return self._retinanet_stages(inputs)
        m = self.model
        state = {}
        original_sizes = [tuple(img.shape[-2:]) for img in inputs]

        def preprocess():
            state["images"], _ = m.transform(inputs)

        def backbone():
            state["features"] = m.backbone(state["images"].tensors)

        def rpn():
            state["proposals"], _ = m.rpn(state["images"], state["features"])

        def roi_heads():
            state["results"], _ = m.roi_heads(state["features"], state["proposals"], state["images"].image_sizes)

        def postprocess():
            state["output"] = m.transform.postprocess(state["results"], state["images"].image_sizes, original_sizes)

        return state, dict(zip(STAGES["mask_rcnn"], (preprocess, backbone, rpn, roi_heads, postprocess)))

    def _retinanet_stages(self, inputs):
        """RetinaNet.forward's eval path, stage by stage (its own calls, in its order)."""
        m = self.model
        state = {}
        original_sizes = [tuple(img.shape[-2:]) for img in inputs]

        def preprocess():
            state["images"], _ = m.transform(inputs)

        def backbone():
            state["features"] = list(m.backbone(state["images"].tensors).values())

        def head():
            state["head_outputs"] = m.head(state["features"])
            state["anchors"] = m.anchor_generator(state["images"], state["features"])

        def detect():
            features, head_outputs = state["features"], state["head_outputs"]
            hw = [x.size(2) * x.size(3) for x in features]
            a = head_outputs["cls_logits"].size(1) // sum(hw)
            per_level = [n * a for n in hw]
            split = {k: list(v.split(per_level, dim=1)) for k, v in head_outputs.items()}
            anchors = [list(x.split(per_level)) for x in state["anchors"]]
            state["results"] = m.postprocess_detections(split, anchors, state["images"].image_sizes)

        def postprocess():
            state["output"] = m.transform.postprocess(state["results"], state["images"].image_sizes, original_sizes)

        return state, dict(zip(STAGES["retinanet"], (preprocess, backbone, head, detect, postprocess)))

    def counts(self, state):
        first = len(state["anchors"][0]) if self.retinanet else len(state["proposals"][0])
        return first, len(state["output"][0]["boxes"])

    def train_inputs(self, images, targets):
        import cv2

        inputs, tv_targets = [], []
        for image, (boxes, polygons, classes) in zip(images, targets):
            h, w = image.shape[1:]
            if self.retinanet:  # boxes only
                inputs.append(self._to_rgb_float(image))
                tv_targets.append({
                    "boxes": torch.from_numpy(boxes).to(self.device),
                    "labels": torch.from_numpy(classes + 1).long().to(self.device),
                })
                continue
            masks = np.zeros((len(polygons), h, w), dtype=np.uint8)
            for mask, poly in zip(masks, polygons):
                # Rasterize the same polygons detcore gets (pixel centres inside -> 1).
                pts = np.round((poly.reshape(-1, 2) - 0.5) * 16).astype(np.int32)
                cv2.fillPoly(mask, [pts], 1, cv2.LINE_8, 4)
            inputs.append(self._to_rgb_float(image))
            tv_targets.append(
                {
                    "boxes": torch.from_numpy(boxes).to(self.device),
                    "labels": torch.from_numpy(classes + 1).long().to(self.device),  # 0 is background
                    "masks": torch.from_numpy(masks).to(self.device),
                }
            )
        return inputs, tv_targets

    def train_forward(self, inputs):
        images, targets = inputs
        return sum(self.model(images, targets).values())


class TorchvisionBfloat16Runner(TorchvisionRunner):
    """torchvision's model under ``torch.autocast(bfloat16)``, in inference and in the training
    step's forward: the like-for-like column beside detcore's bfloat16 (--torchvision-bfloat16)."""

    name = "torchvision_bfloat16"

    def stages(self, inputs):
        state, stages = super().stages(inputs)
        return state, {name: self._in_autocast(stage) for name, stage in stages.items()}

    def _in_autocast(self, stage):
        def run():
            with torch.autocast(self.device.type, dtype=torch.bfloat16):
                stage()

        return run

    def train_forward(self, inputs):
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            return super().train_forward(inputs)


RUNNERS = {
    "detcore": DetcoreRunner,
    "detcore_bfloat16": DetcoreBfloat16Runner,
    "torchvision": TorchvisionRunner,
    "torchvision_bfloat16": TorchvisionBfloat16Runner,
}


# --- measuring (inside a worker subprocess) -------------------------------------------------------
def peak_memory_mb(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    # ru_maxrss is in kilobytes on Linux (bytes on macOS).
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def inference_once(runner, inputs):
    """One inference, stage by stage: ({stage: ms}, (proposals, detections) of the first image)."""
    device = runner.device
    state, stages = runner.stages(inputs)
    times = {}
    with torch.no_grad():
        for name, fn in stages.items():
            times[name] = timed_ms(fn, device)[1]
    return times, runner.counts(state)


def inference_gflop(load):
    """Floating-point operations of one inference in the ops torch's FlopCounterMode knows
    (convolutions, matrix products), in GFLOP (a multiply-add counts 2). The same arithmetic on
    both sides means the time differences come from everything else."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        load.infer()
    return counter.get_total_flops() / 1e9


def train_once(runner, inputs, optimizer):
    """One training step: (forward ms, backward + SGD step ms)."""
    loss, forward_ms = timed_ms(lambda: runner.train_forward(inputs), runner.device)

    def backward_step():
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    _, backward_ms = timed_ms(backward_step, runner.device)
    if not torch.isfinite(loss):
        raise RuntimeError(f"{runner.name}: the training loss is not finite ({loss.item()})")
    return forward_ms, backward_ms


class Workload:
    """A runner with its inference input, training batch and optimizer."""

    def __init__(self, runner, args):
        h, w = args.height, args.width
        self.runner = runner
        self.infer_inputs = runner.inference_inputs(make_image(h, w, seed=0))
        images = [make_image(h, w, seed=1), make_image(h, w, seed=2)]
        targets = [make_targets(h, w, runner.num_classes, seed=s) for s in (1, 2)]
        self.train_inputs = runner.train_inputs(images, targets)
        self.params = [p for p in runner.model.parameters() if p.requires_grad]
        # lr 0: the weights stay as they are, so every repeat does the same work (the update is still computed).
        self.optimizer = torch.optim.SGD(self.params, lr=0.0, momentum=0.9, weight_decay=1e-4)

    def infer(self):
        self.runner.model.eval()
        return inference_once(self.runner, self.infer_inputs)

    def train(self):
        self.runner.model.train()
        return train_once(self.runner, self.train_inputs, self.optimizer)


def measure_times(args, frameworks):
    """Times every framework in one process, alternating them run by run, so that a change of
    load on a shared machine hits all of them alike. A phase with 0 repeats is not run at all."""
    loads = {w.runner.name: w for w in (Workload(RUNNERS[name](args, train=False), args) for name in frameworks)}
    result = {name: {} for name in loads}
    if args.repeats > 0:
        infer = {name: {s: [] for s in STAGES[args.model] + ("total",)} for name in loads}
        counts = {}
        for it in range(args.warmup + args.repeats):
            for name, load in loads.items():
                times, counts[name] = load.infer()
                if it >= args.warmup:
                    for stage, ms in times.items():
                        infer[name][stage].append(ms)
                    infer[name]["total"].append(sum(times.values()))
        for name, load in loads.items():
            i = {f"{k}_ms": median(v) for k, v in infer[name].items()}
            first = "anchors_per_image" if args.model == "retinanet" else "proposals_per_image"
            i[first], i["detections_per_image"] = counts[name]
            i["gflop"] = inference_gflop(load)
            result[name]["infer"] = i
    if args.train_repeats > 0:
        train = {name: {"forward": [], "backward_step": [], "total": []} for name in loads}
        for it in range(args.warmup + args.train_repeats):
            for name, load in loads.items():
                fwd, bwd = load.train()
                if it >= args.warmup:
                    train[name]["forward"].append(fwd)
                    train[name]["backward_step"].append(bwd)
                    train[name]["total"].append(fwd + bwd)
        for name, load in loads.items():
            t = {f"{k}_ms": median(v) for k, v in train[name].items()}
            t["trainable_params"] = sum(p.numel() for p in load.params)
            result[name]["train"] = t
    return result


def measure_memory(args, framework, phase):
    """Peak memory of one framework in one phase (one run, the high-water mark is what counts):
    a worker process answers one such request only."""
    device = torch.device(args.device)
    runner = RUNNERS[framework](args, train=phase == "train")
    load = Workload(runner, args)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    base = peak_memory_mb(device)
    load.train() if phase == "train" else load.infer()
    peak = peak_memory_mb(device)
    return {"peak_memory_mb": peak, "memory_growth_mb": peak - base}


def serve(args):
    """The worker's side: ``{"phase": "time", "frameworks": [...]}`` -> {framework: {phase: times}},
    ``{"phase": "infer" | "train", "frameworks": [one]}`` -> its peak memory."""
    torch.set_num_threads(args.threads)

    def handle(request):
        torch.manual_seed(0)
        frameworks, phase = request["frameworks"], request["phase"]
        unknown = [f for f in frameworks if f not in RUNNERS]
        if unknown or phase not in ("time", "infer", "train") or (phase != "time" and len(frameworks) != 1):
            raise ValueError(f"a worker measures the times of known frameworks or the memory of one, got {request}")
        if phase == "time":
            return measure_times(args, frameworks)
        return measure_memory(args, frameworks[0], phase)

    benchmark_worker.serve(handle)
