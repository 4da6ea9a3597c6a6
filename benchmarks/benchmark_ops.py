#!/usr/bin/env python
"""Benchmark detcore's NMS, ROIAlign, ROIPool, deformable convolution and sigmoid focal loss side by side with torchvision's, in the same process.

Every case runs both libraries on the same seeded inputs, checks once that they agree (same NMS
indices; ROIAlign outputs and gradients allclose; ROIPool outputs equal, gradients equal on the
CPU and allclose on a GPU, where both add them in arrival order) and
reports median times, the two libraries' calls interleaved. A speedup above 1 means detcore is
faster. Without torchvision only detcore's times are printed.

    python benchmarks/benchmark_ops.py                      # CPU, full cases
    python benchmarks/benchmark_ops.py --device cuda --repeats 50
    python benchmarks/benchmark_ops.py --quick              # a smoke run of a few seconds
    python benchmarks/benchmark_ops.py --only deform_conv2d # the cases whose name contains this
    python benchmarks/benchmark_ops.py --background-load 2  # also a column with 2 busy processes beside
    python benchmarks/benchmark_ops.py --baseline DIR       # also detcore from DIR (an older build), interleaved
    python benchmarks/benchmark_ops.py --worst-cases        # NMS of 1e5 and 1e6 boxes, clustered and spread

--background-load N starts N busy processes (`while True: pass`) for the "loaded" measurement
of each case and stops them after it (--background-nice 19 runs them at the lowest priority).
--baseline DIR runs the same cases with the detcore of DIR (a checkout whose detcore/_C was
built from older sources) in a second process, one call at a time between ours, and checks
that its results have the same bits as ours.
"""
import argparse
import os
import platform
import signal
import sys

import torch

# Runnable as `python benchmarks/benchmark_ops.py` from a checkout, without installing detcore.
# The baseline worker imports detcore from the checkout in DETCORE_BENCHMARK_ROOT instead.
BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.environ.get("DETCORE_BENCHMARK_ROOT") or os.path.dirname(BENCHMARKS))
sys.path.insert(1, BENCHMARKS)

import detcore  # noqa: E402
from detcore.layers import batched_nms, deform_conv2d, nms, roi_align, roi_pool, sigmoid_focal_loss  # noqa: E402
from detcore.utils.collect_env import cpu_name  # noqa: E402
from results_file import write_results  # noqa: E402
from background_load import BackgroundLoad  # noqa: E402
import benchmark_worker  # noqa: E402
from benchmark_runner import Runner, print_table  # noqa: E402
from benchmark_timing import timed_ms  # noqa: E402

try:
    import torchvision
    import torchvision.ops as tv_ops
    import torchvision.ops.boxes as tv_boxes
except ImportError:
    torchvision = tv_ops = tv_boxes = None

IMAGE_H, IMAGE_W = 800, 1344


def random_boxes(n, gen, x_max=1000.0, y_max=1000.0):
    """The issue's boxes: top-left uniform in [0, x_max] x [0, y_max], size uniform in [10, 200]."""
    xy = torch.rand(n, 2, generator=gen) * torch.tensor([x_max, y_max])
    wh = 10 + torch.rand(n, 2, generator=gen) * 190
    return torch.cat([xy, xy + wh], dim=1)


def random_scores(n, gen):
    """Uniform scores with no ties (a shuffled uniform grid): tied scores may legitimately be
    ordered differently by the two libraries, which would make the agreement check meaningless."""
    return (torch.randperm(n, generator=gen).float() + 0.5) / n


class Case:
    """One benchmark row: two callables on the same inputs and a check that their results agree.
    torchvision_in_worker: time torchvision in a worker process, killed at the time budget (its
    call may take minutes and cannot be interrupted)."""

    def __init__(self, name, detcore_fn, torchvision_fn, agree_fn, repeats, torchvision_in_worker=False):
        self.name = name
        self.detcore_fn = detcore_fn
        self.torchvision_fn = torchvision_fn
        self.agree_fn = agree_fn
        self.repeats = repeats
        self.torchvision_in_worker = torchvision_in_worker


def _indices_agree(a, b):
    if torch.equal(a.cpu(), b.cpu()):
        return "yes"
    return f"NO ({len(a)} vs {len(b)} kept)"


def _tensors_agree(a, b, atol, rtol):
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    worst = max(
        float((x.float() - y.float()).abs().max()) if x.numel() else 0.0 for x, y in zip(a, b)
    )
    ok = all(torch.allclose(x, y, atol=atol, rtol=rtol) for x, y in zip(a, b))
    return "yes" if ok else f"NO (max diff {worst:.2e})"


def _tensors_equal(a, b):
    return _tensors_agree(a, b, atol=0, rtol=0)


def _roi_pool_agree(ours, theirs):
    """Outputs equal (both take the same maxima). Gradients equal on the CPU; on a GPU both
    libraries add them with atomics in arrival order, so there they are only close."""
    ours = ours if isinstance(ours, tuple) else (ours,)
    theirs = theirs if isinstance(theirs, tuple) else (theirs,)
    verdict = _tensors_equal(ours[0], theirs[0])
    if verdict == "yes" and len(ours) > 1:
        tol = 1e-5 if ours[1].is_cuda else 0
        verdict = _tensors_agree(ours[1], theirs[1], atol=tol, rtol=tol)
    return verdict


def _roi_align_forward_agree(features, rois, args):
    """Judges a forward against torchvision's on the same device; on a GPU, where they differ,
    against torchvision's CPU kernel: torchvision's CUDA kernel is compiled with nvcc's default
    multiply-add fusion, which rounds the sample coordinates differently, while detcore's rounds
    each step as both libraries' CPU kernels do."""

    def agree(ours, theirs):
        verdict = _tensors_agree(ours, theirs, atol=1e-5, rtol=1e-5)
        if verdict != "yes" and ours.is_cuda:
            reference = tv_ops.roi_align(features.cpu(), rois.cpu(), *args)
            if _tensors_agree(ours.cpu(), reference, atol=1e-5, rtol=1e-5) == "yes":
                return "yes (vs torchvision's CPU kernel)"
        return verdict

    return agree


def nms_cases(sizes, thresholds, device, repeats, gen):
    cases = []
    for n in sizes:
        boxes = random_boxes(n, gen).to(device)
        scores = random_scores(n, gen).to(device)
        for thr in thresholds:
            cases.append(
                Case(
                    f"nms N={n} iou={thr}",
                    lambda b=boxes, s=scores, t=thr: nms(b, s, t),
                    tv_ops and (lambda b=boxes, s=scores, t=thr: tv_ops.nms(b, s, t)),
                    _indices_agree,
                    repeats if n < 100000 else max(3, repeats // 5),
                )
            )
    return cases


def nms_worst_cases(device, gen, iou_threshold=0.5):
    """The cases that bound NMS's cost (issue 15): 1e5 and 1e6 boxes, clustered on the issue's
    1000x1000 canvas (most are suppressed) or spread over a canvas of 300 px per sqrt(box), where
    a box overlaps about one other (few are suppressed: a greedy NMS without spatial culling
    compares every pair)."""
    cases = []
    for n in (100000, 1000000):
        for layout, side in (("clustered", 1000.0), ("spread", 300.0 * n**0.5)):
            boxes = random_boxes(n, gen, x_max=side, y_max=side).to(device)
            scores = random_scores(n, gen).to(device)
            cases.append(
                Case(
                    f"nms worst N={n} {layout} (canvas {side:.0f}) iou={iou_threshold}",
                    lambda b=boxes, s=scores: nms(b, s, iou_threshold),
                    tv_ops and (lambda b=boxes, s=scores: tv_ops.nms(b, s, iou_threshold)),
                    _indices_agree,
                    3,
                    torchvision_in_worker=True,
                )
            )
    return cases


def batched_nms_case(n, classes, device, repeats, gen):
    boxes = random_boxes(n, gen).to(device)
    scores = random_scores(n, gen).to(device)
    idxs = torch.randint(0, classes, (n,), generator=gen).to(device)

    def agree(ours, theirs):
        # torchvision.ops.batched_nms loops per class on big inputs but shifts boxes per class on
        # small ones, which rounds coordinates; detcore is exact, so judge it by the exact loop.
        verdict = _indices_agree(ours, theirs)
        if verdict != "yes" and hasattr(tv_boxes, "_batched_nms_vanilla"):
            exact = tv_boxes._batched_nms_vanilla(boxes, scores, idxs, 0.5)
            if _indices_agree(ours, exact) == "yes":
                return "yes (vs torchvision's exact per-class loop)"
        return verdict

    return Case(
        f"batched_nms N={n} classes={classes} iou=0.5",
        lambda: batched_nms(boxes, scores, idxs, 0.5),
        tv_ops and (lambda: tv_ops.batched_nms(boxes, scores, idxs, 0.5)),
        agree,
        repeats,
    )


def roi_align_cases(feature_shape, specs, device, repeats, gen, spatial_scale=0.25):
    """specs: (num_rois, output_size, sampling_ratio); each gives a forward and a fwd+bwd case."""
    features = torch.randn(feature_shape, generator=gen).to(device)
    n = feature_shape[0]
    cases = []
    for k, size, sampling in specs:
        boxes = random_boxes(k, gen, x_max=IMAGE_W, y_max=IMAGE_H)
        index = (torch.arange(k) % n).float()[:, None]  # batch index alternating
        rois = torch.cat([index, boxes], dim=1).to(device)
        grad_out = torch.randn(k, feature_shape[1], size, size, generator=gen).to(device)
        x = features.detach().clone().requires_grad_(True)
        args = ((size, size), spatial_scale, sampling, True)

        def forward(fn, rois=rois, args=args):
            with torch.no_grad():
                return fn(features, rois, *args)

        def forward_backward(fn, rois=rois, args=args, grad_out=grad_out):
            out = fn(x, rois, *args)
            (grad,) = torch.autograd.grad(out, x, grad_out)
            return out.detach(), grad

        label = f"roi_align {k} rois {size}x{size} sampling={sampling}"
        tv = tv_ops.roi_align if tv_ops else None
        cases.append(
            Case(
                label + " fwd",
                lambda f=forward: f(roi_align),
                tv and (lambda f=forward: f(tv)),
                _roi_align_forward_agree(features, rois, args),
                repeats,
            )
        )
        cases.append(
            Case(
                label + " fwd+bwd",
                lambda f=forward_backward: f(roi_align),
                tv and (lambda f=forward_backward: f(tv)),
                # Gradients sum many float32 terms in a different order: a looser tolerance.
                lambda a, b: _tensors_agree(a, b, atol=1e-4, rtol=1e-4),
                repeats,
            )
        )
    return cases


def roi_pool_cases(feature_shape, specs, device, repeats, gen, spatial_scale=0.25):
    """specs: (num_rois, output_size); each gives a forward and a fwd+bwd case. ROIPool is a max:
    both libraries pick the same pixels, so outputs and gradients must be equal, not close."""
    features = torch.randn(feature_shape, generator=gen).to(device)
    n = feature_shape[0]
    cases = []
    for k, size in specs:
        boxes = random_boxes(k, gen, x_max=IMAGE_W, y_max=IMAGE_H)
        index = (torch.arange(k) % n).float()[:, None]
        rois = torch.cat([index, boxes], dim=1).to(device)
        grad_out = torch.randn(k, feature_shape[1], size, size, generator=gen).to(device)
        x = features.detach().clone().requires_grad_(True)

        def forward(fn, rois=rois, size=size):
            with torch.no_grad():
                return fn(features, rois, (size, size), spatial_scale)

        def forward_backward(fn, rois=rois, size=size, grad_out=grad_out):
            out = fn(x, rois, (size, size), spatial_scale)
            (grad,) = torch.autograd.grad(out, x, grad_out)
            return out.detach(), grad

        label = f"roi_pool {k} rois {size}x{size}"
        tv = tv_ops.roi_pool if tv_ops else None
        for suffix, run in ((" fwd", forward), (" fwd+bwd", forward_backward)):
            cases.append(
                Case(
                    label + suffix,
                    lambda f=run: f(roi_pool),
                    tv and (lambda f=run: f(tv)),
                    _roi_pool_agree,
                    repeats,
                )
            )
    return cases


def deform_conv_cases(input_shape, out_channels, device, repeats, gen):
    """A deformable 3x3 conv (stride 1, padding 1, one offset group), without and with a mask
    (DCN v1 and v2); each gives a forward and a forward+backward (all gradients) case."""
    n, c, h, w = input_shape
    x = torch.randn(input_shape, generator=gen).to(device)
    weight = (torch.randn(out_channels, c, 3, 3, generator=gen) / (3 * c**0.5)).to(device)
    bias = torch.randn(out_channels, generator=gen).to(device)
    offset = (torch.randn(n, 18, h, w, generator=gen) * 2).to(device)
    mask = torch.rand(n, 9, h, w, generator=gen).to(device)
    grad_out = torch.randn(n, out_channels, h, w, generator=gen).to(device)
    cases = []
    for m in (None, mask):
        label = f"deform_conv2d {tuple(input_shape)} -> {out_channels} 3x3 " + ("v2 mask" if m is not None else "v1")

        def forward(fn, m=m):
            with torch.no_grad():
                return fn(x, offset, weight, bias, padding=(1, 1), mask=m)

        def forward_backward(fn, m=m):
            leaves = [t.detach().clone().requires_grad_(True) for t in (x, offset, weight, bias)]
            mm = m.detach().clone().requires_grad_(True) if m is not None else None
            out = fn(*leaves, padding=(1, 1), mask=mm)
            grads = torch.autograd.grad(out, leaves + ([mm] if mm is not None else []), grad_out)
            return (out.detach(), *grads)

        tv = tv_ops.deform_conv2d if tv_ops else None
        cases.append(
            Case(
                label + " fwd",
                lambda f=forward: f(deform_conv2d),
                tv and (lambda f=forward: f(tv)),
                lambda a, b: _tensors_agree(a, b, atol=1e-4, rtol=1e-4),
                repeats,
            )
        )
        cases.append(
            Case(
                label + " fwd+bwd",
                lambda f=forward_backward: f(deform_conv2d),
                tv and (lambda f=forward_backward: f(tv)),
                # Weight / bias gradients sum 8400 positions' float32 terms: relative tolerance.
                lambda a, b: _tensors_agree(a, b, atol=1e-3, rtol=1e-3),
                repeats,
            )
        )
    return cases


def focal_loss_cases(anchors, classes, device, repeats, gen):
    """RetinaNet's class loss: logits for every anchor and class, one-hot targets (about 1% of
    anchors positive), alpha 0.25, gamma 2; reductions "sum" (RetinaNet's) and "none", forward
    and forward + backward (the logits' gradient)."""
    x = (torch.randn(anchors, classes, generator=gen) * 2 - 4).to(device)
    positive = torch.rand(anchors, generator=gen) < 0.01
    labels = torch.randint(0, classes, (anchors,), generator=gen)
    targets = torch.zeros(anchors, classes)
    targets[positive, labels[positive]] = 1.0
    targets = targets.to(device)
    cases = []
    for reduction in ("sum", "none"):
        grad_out = torch.ones((anchors, classes) if reduction == "none" else (), device=device)

        def forward(fn, reduction=reduction):
            with torch.no_grad():
                return fn(x, targets, alpha=0.25, gamma=2.0, reduction=reduction)

        def forward_backward(fn, reduction=reduction, grad_out=grad_out):
            leaf = x.detach().clone().requires_grad_(True)
            loss = fn(leaf, targets, alpha=0.25, gamma=2.0, reduction=reduction)
            (grad,) = torch.autograd.grad(loss, leaf, grad_out)
            return loss.detach(), grad

        label = f"sigmoid_focal_loss {anchors}x{classes} {reduction}"
        tv = tv_ops.sigmoid_focal_loss if tv_ops else None
        for suffix, run in ((" fwd", forward), (" fwd+bwd", forward_backward)):
            cases.append(
                Case(
                    label + suffix,
                    lambda f=run: f(sigmoid_focal_loss),
                    tv and (lambda f=run: f(tv)),
                    # A sum of 9.6M float32 terms (ours in double, torchvision's in float32).
                    lambda a, b: _tensors_agree(a, b, atol=1e-5, rtol=1e-4),
                    repeats,
                )
            )
    return cases


def build_cases(device, repeats, quick, worst_cases=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    if worst_cases:
        return nms_worst_cases(device, gen)
    if quick:
        return (
            nms_cases([1000, 5000], [0.5], device, repeats, gen)
            + [batched_nms_case(6000, 80, device, repeats, gen)]
            + roi_align_cases((2, 16, 50, 84), [(200, 7, 2), (200, 7, 0)], device, repeats, gen)
            + roi_pool_cases((2, 16, 50, 84), [(200, 7)], device, repeats, gen)
            + deform_conv_cases((2, 32, 25, 42), 32, device, repeats, gen)
            + focal_loss_cases(12000, 80, device, repeats, gen)
        )
    return (
        nms_cases([1000, 5000, 20000, 100000], [0.5, 0.7], device, repeats, gen)
        + [batched_nms_case(20000, 80, device, repeats, gen)]
        + roi_align_cases(
            (2, 256, 200, 336), [(1000, 7, 2), (1000, 7, 0), (100, 14, 2)], device, repeats, gen
        )
        + roi_pool_cases((2, 256, 200, 336), [(1000, 7)], device, repeats, gen)
        # ResNet-50 res4 at 800x1344 / 16: the deformable 3x3 of a bottleneck block.
        + deform_conv_cases((2, 256, 50, 84), 256, device, repeats, gen)
        # RetinaNet at 800x1333: about 120k anchors (P3-P7, 9 per position) x 80 COCO classes.
        + focal_loss_cases(120000, 80, device, repeats, gen)
    )


def device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed calls per case (20; 3 if --quick)"
    )
    parser.add_argument(
        "--json", default=None, help="output file (default benchmark_results/ops_<device>.json)"
    )
    parser.add_argument("--quick", action="store_true", help="a few small cases, for a smoke test")
    parser.add_argument(
        "--worst-cases",
        action="store_true",
        help="instead of the usual cases: NMS of 1e5 and 1e6 boxes, clustered and spread "
        "(torchvision runs in a worker process, stopped at --tv-budget-s)",
    )
    parser.add_argument(
        "--only",
        default=None,
        help="run only the cases whose name contains this text or one of these comma-separated "
        "texts (e.g. nms,roi_align)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument(
        "--tv-budget-s",
        type=float,
        default=60.0,
        help="skip timing torchvision for a case when its calls would take longer than this",
    )
    parser.add_argument(
        "--background-load",
        type=int,
        default=0,
        metavar="N",
        help="also measure every case with N busy processes beside it (one per core: N = nproc)",
    )
    parser.add_argument(
        "--background-nice",
        type=int,
        default=0,
        metavar="K",
        help="niceness 0..19 of the busy processes (19: niced background work)",
    )
    parser.add_argument(
        "--skip-quiet", action="store_true", help="with --background-load: the loaded column only"
    )
    parser.add_argument(
        "--baseline",
        default=None,
        metavar="DIR",
        help="also time the detcore of the checkout DIR (its _C built), interleaved, in a worker",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # the worker's side
    args = parser.parse_args(argv)
    if args.background_load < 0:
        parser.error("--background-load must be >= 0")
    if not 0 <= args.background_nice <= 19:
        parser.error("--background-nice must be in 0..19")
    if args.skip_quiet and not args.background_load:
        parser.error("--skip-quiet needs --background-load N")
    if args.baseline and not os.path.isdir(os.path.join(args.baseline, "detcore")):
        parser.error(f"--baseline {args.baseline}: no detcore package in that folder")
    return args


def _selected_cases(args, device, repeats):
    cases = build_cases(device, repeats, args.quick, args.worst_cases)
    if args.only:
        wanted = args.only.split(",")
        cases = [c for c in cases if any(w in c.name for w in wanted)]
    return cases


def serve_cases(cases, device):
    """The worker's side (benchmark_worker.py's protocol): one timed call of a case by request,
    ``{"case": name, "impl": "detcore" | "torchvision", "digest": bool}`` -> ``{"ms", ["digest"]}``."""
    by_name = {c.name: c for c in cases}

    def handle(request):
        case = by_name.get(request["case"])
        fn = None
        if case is not None:
            fn = case.detcore_fn if request["impl"] == "detcore" else case.torchvision_fn
        if fn is None:
            raise LookupError(f"no {request['impl']} call for case {request['case']!r} here")
        result, ms = timed_ms(fn, device)
        reply = {"ms": ms}
        if request.get("digest"):
            reply["digest"] = benchmark_worker.digest(result)
        return reply

    benchmark_worker.serve(handle)


def _raise_system_exit(signum, frame):
    sys.exit(128 + signum)  # unwinds the with-blocks, so the busy processes are stopped


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("benchmark_ops: --device cuda but torch sees no CUDA GPU")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    repeats = args.repeats or (3 if args.quick else 20)
    if args.worker:
        serve_cases(_selected_cases(args, device, repeats), device)
        return 0
    signal.signal(signal.SIGTERM, _raise_system_exit)
    json_path = args.json or os.path.join("benchmark_results", f"ops_{args.device}.json")

    worker_args = ["--device", args.device, "--threads", str(torch.get_num_threads()), "--repeats", str(repeats)]
    worker_args += ["--quick"] * args.quick + ["--worst-cases"] * args.worst_cases
    worker_args += ["--only", args.only] if args.only else []
    script = os.path.abspath(__file__)
    own_root = os.path.dirname(BENCHMARKS)
    baseline = None
    if args.baseline:
        baseline = benchmark_worker.Worker(script, worker_args, args.baseline, what="baseline worker")
    runner = Runner(
        device,
        args.tv_budget_s,
        baseline,
        make_tv_worker=lambda: benchmark_worker.Worker(script, worker_args, own_root, what="torchvision worker"),
    )
    loads = [] if args.skip_quiet else [("quiet", None)]
    if args.background_load:
        loads.append(("loaded", BackgroundLoad(args.background_load, args.background_nice)))
    phases = [name for name, _ in loads]

    info = {
        "torch": torch.__version__,
        "torchvision": torchvision.__version__ if torchvision else None,
        "detcore": detcore.__version__,
        "detcore_path": os.path.dirname(detcore.__file__),
        "baseline_path": baseline.detcore_path if baseline else None,
        "device": args.device,
        "device_name": device_name(device),
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "quick": args.quick,
        "background_load": args.background_load,
        "background_nice": args.background_nice,
        "loadavg_at_start": list(os.getloadavg()),
        "python": platform.python_version(),
    }
    print(", ".join(f"{k}={v}" for k, v in info.items()))
    if torchvision is None:
        print("torchvision is not importable: printing detcore times only")

    rows = []
    try:
        for case in _selected_cases(args, device, repeats):
            rows.append(runner.run(case, loads))
            print(f"  done: {case.name}", file=sys.stderr)
    finally:
        runner.close()
    print()
    print_table(rows, phases, baseline is not None)

    write_results(json_path, {**info, "phases": phases, "results": rows})
    print(f"\nwrote {json_path}")
    status = 0
    if any(r["agree"].startswith("NO") for r in rows):
        print("WARNING: detcore and torchvision disagree on some cases (see 'agree')")
        status = 1
    if any(r.get("same_bits_as_baseline") == "NO" for r in rows):
        print("WARNING: detcore and the baseline build give different bits on some cases")
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
