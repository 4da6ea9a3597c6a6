"""detcore.layers.sigmoid_focal_loss_per_image (RetinaNet's class loss over labelled anchors):
per image equal to the focal loss of the gathered non-ignored anchors against one-hot targets
(the float64 reference of test_sigmoid_focal_loss), values and gradients, with one weight per
image or a shared one; ignored anchors get exactly zero gradient; levels in any layout; the
argument checks."""
import pytest
import torch
import torch.nn.functional as F

from detcore.layers import sigmoid_focal_loss_per_image

from .test_sigmoid_focal_loss import focal_loss_reference

K = 5


def _case(sizes=(11, 6, 0, 3), num_images=3, seed=0, dtype=torch.float64):
    """Per level ``[B, R_l, K]`` logits and ``[B, R]`` labels: classes, background (K) and ignored (-1)."""
    g = torch.Generator().manual_seed(seed)
    logits = [(torch.randn(num_images, n, K, generator=g, dtype=torch.float64) * 3).to(dtype) for n in sizes]
    labels = torch.randint(-1, K + 1, (num_images, sum(sizes)), generator=g)
    labels[1] = torch.where(labels[1] < K, K, labels[1])  # image 1: background only, no ignored
    return logits, labels


def _reference(logits, labels, alpha, gamma):
    """Per image: the non-ignored anchors of all levels, one-hot targets, the summed loss."""
    x = torch.cat(logits, dim=1)
    out = []
    for i in range(len(labels)):
        valid = labels[i] >= 0
        targets = F.one_hot(labels[i][valid], K + 1)[:, :K].to(x.dtype)
        out.append(focal_loss_reference(x[i][valid], targets, alpha, gamma, "sum"))
    return torch.stack(out)


def _value_and_grads(fn, logits, labels, grad_out, **kwargs):
    leaves = [x.detach().clone().requires_grad_(True) for x in logits]
    loss = fn(leaves, labels, **kwargs)
    return (loss.detach(), *torch.autograd.grad(loss, leaves, grad_out))


TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-12, atol=1e-13)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("gamma", [2.0, 0.5, 0.0])
@pytest.mark.parametrize("alpha", [0.25, -1.0])
@pytest.mark.parametrize("grad_out", [[0.5, -2.0, 3.0], [0.7, 0.7, 0.7]], ids=["per_image", "shared"])
def test_equals_the_gathered_one_hot_loss(dtype, gamma, alpha, grad_out):
    logits, labels = _case(dtype=dtype)
    grad_out = torch.tensor(grad_out, dtype=dtype)
    ours = _value_and_grads(sigmoid_focal_loss_per_image, logits, labels, grad_out, alpha=alpha, gamma=gamma)
    ref = _value_and_grads(_reference, [x.double() for x in logits], labels, grad_out.double(), alpha=alpha, gamma=gamma)
    assert ours[0].shape == (3,) and ours[0].dtype == dtype
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b.to(dtype), **TOL[dtype])


@pytest.mark.parametrize("grad_out", [[0.5, -2.0, 3.0], [1.0, 1.0, 1.0]], ids=["per_image", "shared"])
def test_ignored_anchors_get_exactly_zero_gradient(grad_out):
    logits, labels = _case(dtype=torch.float32, seed=1)
    grads = _value_and_grads(sigmoid_focal_loss_per_image, logits, labels, torch.tensor(grad_out))[1:]
    grad = torch.cat(grads, dim=1)
    ignored = labels < 0
    assert ignored.any() and (grad[ignored] == 0).all()
    assert (grad[~ignored] != 0).all()


def test_levels_in_any_layout_give_the_same_result():
    # Contiguous levels are read in place; strided ones (e.g. the rows of NCHW maps) copied.
    g = torch.Generator().manual_seed(2)
    strided = [torch.randn(2, K, n, generator=g).transpose(1, 2) for n in (24, 6)]
    labels = torch.randint(-1, K + 1, (2, 30), generator=g)
    assert not strided[0].is_contiguous()
    results = []
    for levels in (strided, [x.contiguous() for x in strided]):
        leaves = [x.detach().clone(memory_format=torch.preserve_format).requires_grad_(True) for x in levels]
        loss = sigmoid_focal_loss_per_image(leaves, labels)
        (loss * torch.tensor([1.0, 3.0])).sum().backward()
        results.append((loss.detach(), [x.grad for x in leaves]))
    assert torch.equal(results[0][0], results[1][0])
    for a, b in zip(results[0][1], results[1][1]):
        assert torch.equal(a, b)


def test_all_background_all_ignored_and_empty():
    x = torch.randn(2, 4, K, dtype=torch.float64)
    labels = torch.tensor([[K] * 4, [-1] * 4])
    loss = sigmoid_focal_loss_per_image([x], labels)
    torch.testing.assert_close(loss[0], focal_loss_reference(x[0], torch.zeros(4, K), reduction="sum"))
    assert abs(float(loss[1])) < 1e-12
    empty = sigmoid_focal_loss_per_image([torch.zeros(2, 0, K)], torch.zeros(2, 0, dtype=torch.int64))
    assert empty.tolist() == [0.0, 0.0]
    x = torch.zeros(0, 3, K, requires_grad=True)  # no images
    loss = sigmoid_focal_loss_per_image([x], torch.zeros(0, 3, dtype=torch.int64))
    loss.sum().backward()
    assert loss.shape == (0,) and x.grad.shape == (0, 3, K)


def test_bad_arguments_name_what_is_wrong():
    x = torch.zeros(2, 4, K)
    labels = torch.full((2, 4), K)
    with pytest.raises(ValueError, match=r"labels must lie in \[-1, 5\].*got values in \[-1, 6\]"):
        sigmoid_focal_loss_per_image([x], torch.tensor([[0, 6, -1, 1], [0, 0, 0, 0]]))
    with pytest.raises(ValueError, match=r"labels must be integers of shape \[B=2, R=4\]"):
        sigmoid_focal_loss_per_image([x], torch.full((2, 5), K))
    with pytest.raises(ValueError, match=r"labels must be integers"):
        sigmoid_focal_loss_per_image([x], labels.float())
    with pytest.raises(ValueError, match=r"logits\[1\] must be a float \[B=2, R_l, K=5\] tensor, got .* \(2, 3, 4\)"):
        sigmoid_focal_loss_per_image([x, torch.zeros(2, 3, 4)], torch.full((2, 7), K))
    with pytest.raises(ValueError, match=r"at least one level of logits and labels \[B, R\]"):
        sigmoid_focal_loss_per_image([], labels)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_are_summed_in_float32(dtype):
    # Under AMP the head's logits arrive in bfloat16 / float16: the sums over ~10^5 anchors must
    # not accumulate in that precision, and the gradient comes back in the logits' dtype.
    logits, labels = _case(sizes=(4000, 500), num_images=2, dtype=dtype)
    leaves = [x.detach().clone().requires_grad_(True) for x in logits]
    loss = sigmoid_focal_loss_per_image(leaves, labels, alpha=0.25, gamma=2.0)
    assert loss.dtype == torch.float32
    expected = _reference([x.double() for x in logits], labels, 0.25, 2.0)
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-4)
    grads = torch.autograd.grad(loss.sum(), leaves)
    assert all(g.dtype == dtype for g in grads)
