"""detcore.layers.sigmoid_focal_loss: equal to torchvision's Python version (values and gradients
of inputs and targets, every reduction, alpha, gamma, soft targets) and to a float64 reference
written here; stable at extreme logits where torchvision's gradient is NaN; the CPU kernel's
vector variants (baseline / AVX2 / AVX-512), threads, the dispatcher paths (autocast,
TorchScript, torch.compile, fake tensors, opcheck) and the argument checks."""
import inspect

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from detcore.layers import OpArgumentError, sigmoid_focal_loss

try:
    import torchvision
    from torchvision.ops import sigmoid_focal_loss as tv_focal_loss
except ImportError:  # detcore works without torchvision; only the comparisons to it skip
    torchvision = tv_focal_loss = None

needs_torchvision = pytest.mark.skipif(torchvision is None, reason="torchvision is not importable")
REDUCTIONS = ["none", "mean", "sum"]
GAMMAS = [0.0, 1.0, 2.0, 3.0, 1.5, 0.5]  # 0, 1, 2 are the kernels' product paths, others pow


# --- the reference ---------------------------------------------------------------------------------
def focal_loss_reference(inputs, targets, alpha=0.25, gamma=2.0, reduction="none"):
    """The focal loss written from its definition in float64, in log-sigmoid form (no log(0)):
    ce = -t log p - (1 - t) log(1 - p), q = 1 - p_t, loss = a_t ce q^gamma. Differentiable."""
    x, t = inputs.double(), targets.double()
    ce = -(t * F.logsigmoid(x) + (1 - t) * F.logsigmoid(-x))
    q = t * torch.sigmoid(-x) + (1 - t) * torch.sigmoid(x)
    loss = ce * q**gamma
    if alpha >= 0:
        loss = (alpha * t + (1 - alpha) * (1 - t)) * loss
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


# --- inputs ----------------------------------------------------------------------------------------
def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _logits(shape, seed, scale=3.0, dtype=torch.float32):
    return (torch.randn(shape, generator=_gen(seed), dtype=torch.float64) * scale).to(dtype)


def _targets(shape, seed, soft=False, dtype=torch.float32):
    g = _gen(seed + 1000)
    if soft:
        t = torch.rand(shape, generator=g, dtype=torch.float64)
        t.view(-1)[::7] = 0.0  # the ends of [0, 1] too
        t.view(-1)[3::7] = 1.0
        return t.to(dtype)
    return (torch.rand(shape, generator=g) < 0.3).to(dtype)


def _loss_and_grads(fn, x, t, grad_out, **kwargs):
    """fn's loss and the gradients of <loss, grad_out> for inputs and targets."""
    x = x.detach().clone().requires_grad_(True)
    t = t.detach().clone().requires_grad_(True)
    loss = fn(x, t, **kwargs)
    gx, gt = torch.autograd.grad(loss, (x, t), grad_out)
    return loss.detach(), gx, gt


def _grad_out(loss_shape, seed, dtype):
    return torch.randn(loss_shape, generator=_gen(seed), dtype=torch.float64).to(dtype)


TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float64: dict(rtol=1e-12, atol=1e-14)}
# torchvision's float32 is the less accurate side: 1 - p_t by subtraction loses the low bits of
# p_t near 1, which (1 - p_t)^(gamma - 1) magnifies (0.1% off at logit -11 for gamma 0.5, where
# ours equals the float64 reference); in float64, 3e-12.
TV_TOL = {torch.float32: dict(rtol=2e-3, atol=1e-5), torch.float64: dict(rtol=1e-9, atol=1e-12)}


# --- values and gradients --------------------------------------------------------------------------
@needs_torchvision
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("soft", [False, True])
def test_equals_torchvision(dtype, reduction, soft):
    """Values and both gradients, against torchvision.ops.sigmoid_focal_loss in the same dtype,
    for every gamma path and alpha weighting or none. Logits of scale 3 (no saturation:
    torchvision's own float32 gradients stay finite)."""
    shape = (37, 11)
    x, t = _logits(shape, 1, dtype=dtype), _targets(shape, 2, soft, dtype)
    grad_out = _grad_out(shape if reduction == "none" else (), 3, dtype)
    for gamma in GAMMAS:
        for alpha in (0.25, -1.0):
            args = dict(alpha=alpha, gamma=gamma, reduction=reduction)
            ours = _loss_and_grads(sigmoid_focal_loss, x, t, grad_out, **args)
            theirs = _loss_and_grads(tv_focal_loss, x, t, grad_out, **args)
            for a, b in zip(ours, theirs):
                assert a.dtype == dtype and a.shape == b.shape
                torch.testing.assert_close(a, b, **TV_TOL[dtype], msg=lambda m: f"{args}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_equals_reference(dtype, reduction):
    shape = (5, 9, 13)
    x, t = _logits(shape, 4, scale=6.0, dtype=dtype), _targets(shape, 5, soft=True, dtype=dtype)
    grad_out = _grad_out(shape if reduction == "none" else (), 6, dtype)
    for gamma in GAMMAS:
        for alpha in (0.25, 0.0, 1.0, -1.0):
            args = dict(alpha=alpha, gamma=gamma, reduction=reduction)
            ours = _loss_and_grads(sigmoid_focal_loss, x, t, grad_out, **args)
            ref = _loss_and_grads(focal_loss_reference, x, t, grad_out, **args)
            for a, b in zip(ours, ref):
                torch.testing.assert_close(a, b.to(dtype), **TOL[dtype], msg=lambda m: f"{args}: {m}")


def _capabilities():
    """The CPU kernel's instruction-set variants this machine can run (DETCORE_CPU_CAPABILITY)."""
    best = torch.ops.detcore._cpu_capability()
    order = ["baseline", "avx2", "avx512"]
    return order[: order.index(best) + 1]


@pytest.mark.parametrize("gamma", GAMMAS)
def test_float32_across_all_logits_within_a_few_ulp(monkeypatch, gamma):
    """Float32 logits from -110 to 110 every 0.007 (the kernel's own exp / log1p / pow, all the
    way into denormal results), in every vector variant this CPU has (DETCORE_CPU_CAPABILITY),
    against the float64 reference. The loss within 8 float32 ulp (2^-23) of its value. A
    derivative is a sum of terms that can cancel (d/dt of gamma 0 at t = 0: -0.5 ce + 0.75 x), so
    each is held to 8 ulp of the size of its terms, w (ce + (1 + gamma) (|x| + 1)) with
    w = q^gamma, plus 8 ulp of its value; denormal results to a few of their steps."""
    x = torch.linspace(-110, 110, 31417, dtype=torch.float64).float()
    x = torch.cat([x, torch.tensor([0.0, -0.0, 1e-30, -1e-30, 17.0, -17.0, 88.0, -88.0, 104.0, -104.0])])
    x = x.repeat(3)
    t = torch.tensor([0.0, 1.0, 0.3]).repeat_interleave(len(x) // 3)
    ulp = 2.0**-23
    ref = _loss_and_grads(focal_loss_reference, x, t, torch.ones(len(x), dtype=torch.float64), gamma=gamma)
    x64, t64 = x.double(), t.double()
    ce = -(t64 * F.logsigmoid(x64) + (1 - t64) * F.logsigmoid(-x64))
    w = (t64 * torch.sigmoid(-x64) + (1 - t64) * torch.sigmoid(x64)) ** gamma
    terms = w * (ce + (1 + gamma) * (x64.abs() + 1))
    for capability in _capabilities():
        monkeypatch.setenv("DETCORE_CPU_CAPABILITY", capability)
        ours = _loss_and_grads(sigmoid_focal_loss, x, t, torch.ones(len(x)), gamma=gamma)
        for name, a, b, scale in zip(("loss", "d inputs", "d targets"), ours, ref, (0, terms, terms)):
            assert bool(torch.isfinite(a).all()), name
            err = (a.double() - b).abs()
            # A denormal intermediate (q ~ exp(-|x|) past |x| = 87) has an absolute error of the
            # smallest denormal, 2^-149, which the terms multiply by up to (1 + gamma)(|x| + 1);
            # for gamma < 1, q^gamma then has an absolute error of (2^-149)^gamma.
            tiny = 2.0**-149 + (2.0**-149) ** gamma * (0 < gamma < 1)
            bound = 8 * ulp * (b.abs() + scale) + 4 * tiny * (1 + gamma) * (x64.abs() + 1)
            worst = int((err - bound).argmax())
            assert bool((err <= bound).all()), (
                f"{capability}: {name} at x={float(x[worst])}, t={float(t[worst])}: "
                f"{float(a[worst])} vs {float(b[worst])}"
            )


def test_vector_variants_agree(monkeypatch):
    """Every variant this CPU has gives the same losses to a few ulp (FMA or not) and the same
    sum to float32 rounding (4, 8 or 16 lanes of double partial sums). Their derivatives are each
    held to the float64 reference in test_float32_across_all_logits_within_a_few_ulp."""
    x, t = _logits((50000,), 7, scale=8.0), _targets((50000,), 8, soft=True)
    results = {}
    for cap in _capabilities():
        monkeypatch.setenv("DETCORE_CPU_CAPABILITY", cap)
        results[cap] = [sigmoid_focal_loss(x, t, gamma=g, reduction=r) for g in (2.0, 1.5) for r in ("none", "sum")]
    for cap, got in results.items():
        for a, b in zip(got, results["baseline"]):
            torch.testing.assert_close(a, b, rtol=4e-7 if a.dim() == 0 else 5e-6, atol=1e-30, msg=cap)


@pytest.mark.parametrize("gamma", GAMMAS)
def test_extreme_logits_stay_finite_and_right(gamma):
    """Logits of +-100 (and +-1000 in float64): torchvision's gradient is NaN there for
    gamma < 1 (0 * inf); ours is the limit, and equals the float64 reference."""
    # atol: at the well-classified logits q = exp(-|x|) is below the dtype's range (a denormal
    # of a few bits, or 0), so q^0.5 is off by up to sqrt(smallest denormal): 4e-23 in float32.
    for dtype, big, atol in ((torch.float32, 100.0, 1e-20), (torch.float64, 1000.0, 1e-150)):
        x = torch.tensor([big, -big, big, -big, 30.0, -30.0, 0.0], dtype=dtype)
        t = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.5], dtype=dtype)
        ours = _loss_and_grads(sigmoid_focal_loss, x, t, torch.ones_like(x), gamma=gamma)
        ref = _loss_and_grads(focal_loss_reference, x, t, torch.ones_like(x, dtype=torch.float64), gamma=gamma)
        for a, b in zip(ours, ref):
            assert bool(torch.isfinite(a).all())
            # The reference's own gradient is NaN at the saturated, well-classified logits for
            # gamma < 1; the limit there is 0.
            b = torch.nan_to_num(b, nan=0.0)
            torch.testing.assert_close(a, b.to(dtype), rtol=1e-5, atol=atol)
        # Wrong with confidence: the loss is |x| times the class weight.
        assert float(ours[0][2]) == pytest.approx(0.75 * big, rel=1e-6)
        assert float(ours[0][3]) == pytest.approx(0.25 * big, rel=1e-6)


@needs_torchvision
def test_extreme_logits_equal_torchvision_where_it_is_finite():
    x = torch.tensor([100.0, -100.0, 100.0, -100.0, 20.0, -20.0, 0.0], requires_grad=True)
    t = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.5])
    for gamma in GAMMAS:
        for red in REDUCTIONS:
            g = torch.ones(7) if red == "none" else torch.tensor(1.0)
            ours = _loss_and_grads(sigmoid_focal_loss, x, t, g, gamma=gamma, reduction=red)
            theirs = _loss_and_grads(tv_focal_loss, x, t, g, gamma=gamma, reduction=red)
            for a, b in zip(ours, theirs):
                finite = torch.isfinite(b)
                torch.testing.assert_close(a[finite], b[finite], rtol=1e-5, atol=1e-6)


# --- the class weight a_t for any alpha ----------------------------------------------------------
# Tiny alphas (a positive's weight far below 1), both ends, and 1 - alpha tiny (a negative's).
ALPHAS = [0.0, 1e-7, 2.5e-6, 1e-4, 0.25, 1 - 1e-7, 1.0]


def alpha_grid(dtype):
    """Logits, moderate and saturated (q exactly 0 or 1 at +-1e4), times hard and soft targets."""
    x = torch.tensor([-1e4, -30.0, -3.0, 0.0, 2.0, 30.0, 1e4], dtype=torch.float64)
    t = torch.tensor([0.0, 1e-3, 0.3, 0.999, 1.0], dtype=torch.float64)
    x, t = torch.meshgrid(x, t, indexing="ij")
    return x.flatten().to(dtype), t.flatten().to(dtype)


def assert_alpha_weighting_is_precise(got, x, t, alpha, gamma, where=""):
    """`got`: the loss (reduction 'none') and its gradients for inputs and targets (grad 1), at
    alpha_grid's points, against the float64 reference. a_t = alpha t + (1 - alpha)(1 - t) is a
    factor of the loss and of the inputs' gradient, so an a_t off by a relative e moves them by e
    (the affine form (1 - alpha) + (2 alpha - 1) t did: 0.4 at alpha 1e-7, t = 1 in float32).
    The loss, a product, is held to 16 ulp of its value; each derivative to 16 ulp of the size of
    its terms (a_t times those of the unweighted one, w (ce + (1 + gamma)(|x| + 1)) with
    w = q^gamma, plus |2 alpha - 1| ce w for the targets': d a_t / d t)."""
    dtype = got[0].dtype
    ulp, tiny = torch.finfo(dtype).eps, torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps
    ref = _loss_and_grads(focal_loss_reference, x, t, torch.ones(len(x), dtype=torch.float64), alpha=alpha, gamma=gamma)
    x64, t64 = x.double(), t.double()
    ce = -(t64 * F.logsigmoid(x64) + (1 - t64) * F.logsigmoid(-x64))
    w = (t64 * torch.sigmoid(-x64) + (1 - t64) * torch.sigmoid(x64)) ** gamma
    a_t = alpha * t64 + (1 - alpha) * (1 - t64)
    terms = a_t * w * (ce + (1 + gamma) * (x64.abs() + 1))
    scales = (torch.zeros_like(x64), terms, terms + abs(2 * alpha - 1) * ce * w)
    for name, a, b, scale in zip(("loss", "d inputs", "d targets"), got, ref, scales):
        assert a.dtype == dtype and bool(torch.isfinite(a).all()), name
        err = (a.double() - b).abs()
        # Results below the dtype's normal range (a_t ce w at x = 30, t = 1: 1e-46) keep an
        # absolute error of a few of its smallest steps.
        bound = 16 * ulp * (b.abs() + scale) + 4 * tiny * (1 + gamma) * (x64.abs() + 1)
        worst = int((err - bound).argmax())
        assert bool((err <= bound).all()), (
            f"{where} alpha={alpha} gamma={gamma} {name} at x={float(x[worst])}, t={float(t[worst])}: "
            f"{float(a[worst])!r} vs {float(b[worst])!r}"
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tiny_alphas_keep_the_loss_and_gradients_precise(monkeypatch, dtype):
    """Every alpha of ALPHAS (0 and 1 included), hard and soft targets, saturated logits, every
    gamma path: float64 on scalars, float32 in every vector variant of this CPU."""
    x, t = alpha_grid(dtype)
    for capability in _capabilities() if dtype == torch.float32 else ["baseline"]:
        monkeypatch.setenv("DETCORE_CPU_CAPABILITY", capability)
        for alpha in ALPHAS:
            for gamma in (0.0, 1.0, 2.0, 1.5):
                got = _loss_and_grads(sigmoid_focal_loss, x, t, torch.ones(len(x), dtype=dtype), alpha=alpha, gamma=gamma)
                assert_alpha_weighting_is_precise(got, x, t, alpha, gamma, capability)


@needs_torchvision
def test_tiny_alpha_of_the_issue_equals_torchvision_in_float64():
    """The case found by torchvision's exact value: x = -1e4, t = 1, alpha = 2.5e-6 and 1e-7,
    where the loss is alpha |x|."""
    for alpha in (2.5e-6, 1e-7):
        x, t = torch.tensor([-1e4]), torch.tensor([1.0])
        expected = tv_focal_loss(x.double(), t.double(), alpha=alpha)
        assert float(expected) == pytest.approx(alpha * 1e4, rel=1e-12)
        torch.testing.assert_close(sigmoid_focal_loss(x, t, alpha=alpha), expected.float(), rtol=4e-7, atol=0)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("gamma", [0.0, 1.0, 2.0, 1.5, 3.0])
def test_gradcheck(reduction, gamma):
    x = _logits((4, 6), 9, dtype=torch.float64).requires_grad_(True)
    # Soft targets away from 0 and 1, so the finite differences stay inside [0, 1].
    t = (0.1 + 0.8 * torch.rand(4, 6, generator=_gen(10), dtype=torch.float64)).requires_grad_(True)
    t.data[0, :3] = torch.tensor([0.0, 1.0, 0.5], dtype=torch.float64)

    def loss(a, b):
        return sigmoid_focal_loss(a, b, alpha=0.3, gamma=gamma, reduction=reduction)

    # Hard targets: gradient for inputs only (a step in t would leave [0, 1]).
    hard = (torch.rand(4, 6, generator=_gen(11)) < 0.5).double()
    assert torch.autograd.gradcheck(lambda a: loss(a, hard), (x,))
    t_inner = t.detach().clone()
    t_inner[0, :3] = 0.5
    t_inner.requires_grad_(True)
    assert torch.autograd.gradcheck(loss, (x, t_inner))


def test_double_backward_is_an_error_not_silent_zeros():
    x = _logits((3, 4), 12, dtype=torch.float64).requires_grad_(True)
    t = _targets((3, 4), 13, dtype=torch.float64)
    loss = sigmoid_focal_loss(x, t, reduction="sum")
    (grad,) = torch.autograd.grad(loss, x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        grad.sum().backward()


def test_targets_gradient_only_when_asked():
    x = _logits((6, 5), 14).requires_grad_(True)
    t = _targets((6, 5), 15, soft=True)
    sigmoid_focal_loss(x, t, reduction="sum").backward()
    assert x.grad is not None and t.grad is None
    gx, gt = torch.ops.detcore._sigmoid_focal_loss_backward(torch.tensor(1.0), x.detach(), t, 0.25, 2.0, "sum", False)
    assert torch.equal(gx, x.grad) and gt.shape == (0,)
    gx2, gt2 = torch.ops.detcore._sigmoid_focal_loss_backward(torch.tensor(1.0), x.detach(), t, 0.25, 2.0, "sum", True)
    assert torch.equal(gx2, gx) and gt2.shape == (6, 5)


# --- sizes, layouts, threads -----------------------------------------------------------------------
def test_empty_inputs():
    x = torch.zeros(0, 80, requires_grad=True)
    t = torch.zeros(0, 80)
    assert sigmoid_focal_loss(x, t).shape == (0, 80)
    assert float(sigmoid_focal_loss(x, t, reduction="sum").detach()) == 0.0
    assert torch.isnan(sigmoid_focal_loss(x, t, reduction="mean"))  # torch's mean of nothing
    sigmoid_focal_loss(x, t, reduction="sum").backward()
    assert x.grad.shape == (0, 80)
    if torchvision is not None:
        assert torch.isnan(tv_focal_loss(x, t, reduction="mean"))


def test_one_element_and_zero_dim():
    x = torch.tensor(0.7, dtype=torch.float64)
    t = torch.tensor(1.0, dtype=torch.float64)
    got = sigmoid_focal_loss(x, t)
    assert got.shape == ()
    torch.testing.assert_close(got, focal_loss_reference(x, t), rtol=1e-14, atol=0)


@pytest.mark.parametrize("n", [1, 3, 15, 16, 17, 31, 33, 16383, 16384, 16385, 40000])
def test_sizes_around_vector_and_block_ends(n):
    """The padded last vector of a block and the last, partial block."""
    x, t = _logits((n,), 16), _targets((n,), 17, soft=True)
    got = _loss_and_grads(sigmoid_focal_loss, x, t, torch.ones(n))
    ref = _loss_and_grads(focal_loss_reference, x, t, torch.ones(n, dtype=torch.float64))
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b.float(), rtol=1e-5, atol=1e-7)
    for reduction in ("sum", "mean"):
        total = sigmoid_focal_loss(x, t, reduction=reduction)
        torch.testing.assert_close(total, focal_loss_reference(x, t, reduction=reduction).float(), rtol=1e-6, atol=0)


def test_non_contiguous_inputs_targets_and_grad():
    x = _logits((40, 30), 18).t()  # [30, 40], strided
    t = _targets((40, 30), 19, soft=True).t()
    grad_out = _grad_out((40, 30), 20, torch.float32).t()
    assert not (x.is_contiguous() or t.is_contiguous() or grad_out.is_contiguous())
    got = _loss_and_grads(sigmoid_focal_loss, x, t, grad_out, reduction="none")
    contiguous = _loss_and_grads(
        sigmoid_focal_loss, x.contiguous(), t.contiguous(), grad_out.contiguous(), reduction="none"
    )
    for a, b in zip(got, contiguous):
        assert torch.equal(a, b)
    # The expanded (zero-stride) grad of loss.sum() is read as one value.
    y = x.detach().clone().requires_grad_(True)
    sigmoid_focal_loss(y, t).sum().backward()
    _, ones_grad, _ = _loss_and_grads(sigmoid_focal_loss, x, t, torch.ones(30, 40))
    assert torch.equal(y.grad, ones_grad)


def test_inputs_are_not_modified():
    x, t = _logits((8, 9), 21), _targets((8, 9), 22, soft=True)
    x0, t0 = x.clone(), t.clone()
    sigmoid_focal_loss(x, t, reduction="sum")
    assert torch.equal(x, x0) and torch.equal(t, t0)


def test_results_do_not_depend_on_the_number_of_threads():
    """A fixed block partition and summation order: bit for bit the same with 1 or 2 threads."""
    x, t = _logits((120000,), 23), _targets((120000,), 24, soft=True)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            out = [sigmoid_focal_loss(x, t, reduction=r) for r in REDUCTIONS]
            out += list(_loss_and_grads(sigmoid_focal_loss, x, t, torch.tensor(1.0), reduction="mean")[1:])
            results.append(out)
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)


def test_sum_is_accurate_for_many_elements():
    """1.2M terms (RetinaNet's 120k anchors x 80 classes are 9.6M): the double accumulation stays
    within float32 rounding of the float64 sum."""
    x, t = _logits((15000, 80), 25, scale=2.0), (torch.rand(15000, 80, generator=_gen(26)) < 0.01).float()
    got = sigmoid_focal_loss(x, t, reduction="sum")
    expected = focal_loss_reference(x, t, reduction="sum")
    assert abs(float(got) - float(expected)) <= 2 * 2.0**-24 * float(expected)


# --- dtypes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_on_cpu_equal_float32_of_the_same_values(dtype):
    x = _logits((7, 9), 27).to(dtype).requires_grad_(True)
    t = _targets((7, 9), 28, soft=True).to(dtype)
    for reduction in REDUCTIONS:
        got = sigmoid_focal_loss(x, t, reduction=reduction)
        assert got.dtype == dtype
        expected = sigmoid_focal_loss(x.detach().float(), t.float(), reduction=reduction)
        assert torch.equal(got, expected.to(dtype))
    x.grad = None
    sigmoid_focal_loss(x, t, reduction="sum").backward()
    x32 = x.detach().float().requires_grad_(True)
    sigmoid_focal_loss(x32, t.float(), reduction="sum").backward()
    assert x.grad.dtype == dtype and torch.equal(x.grad, x32.grad.to(dtype))


@needs_torchvision
def test_mixed_float_dtypes_promote_like_torchvision():
    x, t = _logits((5, 4), 29), _targets((5, 4), 30, soft=True, dtype=torch.float64)
    got = sigmoid_focal_loss(x, t)
    expected = tv_focal_loss(x, t)
    assert got.dtype == expected.dtype == torch.float64
    # torchvision takes the sigmoid of the float32 logits in float32, we all in float64.
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-9)


def test_autocast_cpu_runs_in_float32():
    x, t = _logits((16, 20), 31), _targets((16, 20), 32)
    expected = sigmoid_focal_loss(x, t, reduction="sum")
    low = x.to(torch.bfloat16).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = sigmoid_focal_loss(x, t, reduction="sum")
        low_out = sigmoid_focal_loss(low, t.to(torch.bfloat16), reduction="sum")
    assert out.dtype == torch.float32 and torch.equal(out, expected)
    assert low_out.dtype == torch.float32
    assert torch.equal(low_out, sigmoid_focal_loss(low.detach().float(), t, reduction="sum"))
    low_out.backward()
    assert low.grad is not None and low.grad.dtype == torch.bfloat16


# --- argument checks -------------------------------------------------------------------------------
def _raises(match, *args, **kwargs):
    with pytest.raises(OpArgumentError, match=match) as info:
        sigmoid_focal_loss(*args, **kwargs)
    assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)
    assert "\n" not in str(info.value).strip()


def test_bad_arguments_name_what_is_wrong():
    x, t = torch.zeros(4, 3), torch.zeros(4, 3)
    _raises(r"sigmoid_focal_loss: targets must have the shape of inputs, got inputs \[4, 3\] and targets \[4, 1\]", x, t[:, :1])
    _raises(r"targets must have the dtype of inputs \(Float\), got Long", x, t.long())
    _raises(r"inputs must be float32, float64, float16 or bfloat16 logits, got Long", x.long(), t.long())
    _raises("Invalid value for reduction: it must be 'none', 'mean' or 'sum', got 'average'", x, t, reduction="average")
    for alpha in (1.5, float("nan"), float("inf")):
        _raises(r"alpha must be in \[0, 1\], or negative for no alpha weighting", x, t, alpha=alpha)
    for gamma in (-1.0, float("nan"), float("inf")):
        _raises("gamma must be a finite number >= 0", x, t, gamma=gamma)


@needs_torchvision
def test_bad_reduction_is_a_value_error_like_torchvision():
    """torchvision's own test matches "Invalid" in the message of a bad reduction."""
    x, t = torch.zeros(4, 3), torch.zeros(4, 3)
    for fn in (sigmoid_focal_loss, tv_focal_loss):
        with pytest.raises(ValueError, match="Invalid"):
            fn(x, t, reduction="average")
        with pytest.raises(ValueError):  # torchvision: "Target size ... must be the same"
            fn(x, t[:, :2])


@pytest.mark.parametrize("bad,shown", [(-1.0, "-1"), (1.5, "1.5"), (float("nan"), "nan"), (float("inf"), "inf")])
def test_targets_outside_0_1_name_the_element(bad, shown):
    x, t = torch.zeros(3, 40000), torch.zeros(3, 40000)
    t[2, 30000] = bad
    t[2, 39999] = 7.0  # a later one: the first in memory order is reported
    _raises(rf"targets must be probabilities in \[0, 1\], got {shown} at targets\[2, 30000\]", x, t, reduction="sum")
    _raises(r"at targets\[2, 30000\]", x, t, reduction="none")
    with pytest.raises(OpArgumentError, match=r"at targets\[2, 30000\]"):
        torch.ops.detcore._sigmoid_focal_loss_backward(torch.tensor(1.0), x, t, 0.25, 2.0, "sum", False)
    _raises(r"got -1 at targets\[0\]", torch.zeros(1, dtype=torch.float64), torch.full((1,), -1.0, dtype=torch.float64))


def test_backward_op_checks_grad():
    x, t = torch.zeros(4, 3), torch.zeros(4, 3)
    backward = torch.ops.detcore._sigmoid_focal_loss_backward
    with pytest.raises(OpArgumentError, match=r"grad must be a scalar \(\[\]\) for reduction 'sum', got shape \[4, 3\]"):
        backward(torch.ones(4, 3), x, t, 0.25, 2.0, "sum", False)
    with pytest.raises(OpArgumentError, match=r"grad must have the shape of inputs for reduction 'none'"):
        backward(torch.ones(()), x, t, 0.25, 2.0, "none", False)
    with pytest.raises(OpArgumentError, match=r"grad must have the dtype of inputs"):
        backward(torch.ones((), dtype=torch.float64), x, t, 0.25, 2.0, "mean", False)


@pytest.mark.parametrize("dtype", [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)])
def test_float8_is_a_clear_error(dtype):
    x = torch.zeros(2, 3).to(dtype)
    with pytest.raises(OpArgumentError, match="inputs must be float32, float64, float16 or bfloat16"):
        torch.ops.detcore.sigmoid_focal_loss(x, x, 0.25, 2.0, "sum")


# --- the drop-in and the dispatcher ----------------------------------------------------------------
@needs_torchvision
def test_signature_is_torchvisions():
    ours = inspect.signature(sigmoid_focal_loss).parameters
    theirs = inspect.signature(tv_focal_loss).parameters
    assert [(p.name, p.default) for p in ours.values()] == [(p.name, p.default) for p in theirs.values()]


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_torchscript():
    scripted = torch.jit.script(sigmoid_focal_loss)
    x, t = _logits((6, 7), 33), _targets((6, 7), 34)
    for reduction in REDUCTIONS:
        assert torch.equal(scripted(x, t, 0.25, 2.0, reduction), sigmoid_focal_loss(x, t, reduction=reduction))


def test_fake_tensors_and_meta_give_shapes():
    x, t = _logits((6, 7), 35), _targets((6, 7), 36)
    with FakeTensorMode() as mode:
        fx, ft = mode.from_tensor(x), mode.from_tensor(t)
        assert torch.ops.detcore.sigmoid_focal_loss(fx, ft, 0.25, 2.0, "none").shape == (6, 7)
        assert torch.ops.detcore.sigmoid_focal_loss(fx, ft, 0.25, 2.0, "sum").shape == ()
        gx, gt = torch.ops.detcore._sigmoid_focal_loss_backward(fx.sum(), fx, ft, 0.25, 2.0, "sum", True)
        assert gx.shape == (6, 7) and gt.shape == (6, 7)
    meta = torch.ops.detcore.sigmoid_focal_loss(
        torch.empty(3, 5, device="meta"), torch.empty(3, 5, device="meta"), 0.25, 2.0, "mean"
    )
    assert meta.shape == () and meta.device.type == "meta"


def test_opcheck():
    x = _logits((6, 7), 37).requires_grad_(True)
    t = _targets((6, 7), 38, soft=True)
    torch.library.opcheck(torch.ops.detcore.sigmoid_focal_loss.default, (x, t, 0.25, 2.0, "none"))
    t64 = t.double().requires_grad_(True)
    torch.library.opcheck(torch.ops.detcore.sigmoid_focal_loss.default, (x.detach().double(), t64, -1.0, 1.5, "mean"))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_fullgraph_forward_and_backward(backend):
    t = _targets((30, 8), 39, soft=True)

    def loss(x):
        return sigmoid_focal_loss(x * 2, t, reduction="sum") / 4

    x1 = _logits((30, 8), 40).requires_grad_(True)
    x2 = x1.detach().clone().requires_grad_(True)
    expected = loss(x1)
    expected.backward()
    got = torch.compile(loss, fullgraph=True, backend=backend)(x2)
    got.backward()
    assert torch.equal(got, expected) and torch.equal(x2.grad, x1.grad)
