import pytest
import torch

from detcore.modeling.sampling import subsample_labels


def _labels(num_pos, num_neg, num_ignore, pos_value=1, bg_label=0, seed=0):
    labels = torch.tensor([pos_value] * num_pos + [bg_label] * num_neg + [-1] * num_ignore, dtype=torch.int64)
    return labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))]


def _check_valid(labels, pos, neg, bg_label=0):
    assert pos.dtype == torch.int64 and neg.dtype == torch.int64
    assert len(set(pos.tolist())) == len(pos) and len(set(neg.tolist())) == len(neg)
    assert ((labels[pos] != -1) & (labels[pos] != bg_label)).all()
    assert (labels[neg] == bg_label).all()


def test_balanced_when_both_are_plentiful():
    labels = _labels(500, 3000, 200)
    pos, neg = subsample_labels(labels, 256, 0.5, 0)
    _check_valid(labels, pos, neg)
    assert len(pos) == 128 and len(neg) == 128


def test_few_positives_filled_with_negatives():
    labels = _labels(10, 3000, 50)
    pos, neg = subsample_labels(labels, 256, 0.5, 0)
    _check_valid(labels, pos, neg)
    assert len(pos) == 10 and len(neg) == 246


def test_few_of_both_returns_everything():
    labels = _labels(5, 20, 100)
    pos, neg = subsample_labels(labels, 256, 0.5, 0)
    _check_valid(labels, pos, neg)
    assert sorted(pos.tolist()) == torch.nonzero(labels == 1).flatten().tolist()
    assert sorted(neg.tolist()) == torch.nonzero(labels == 0).flatten().tolist()


def test_roi_style_background_label_and_fraction():
    num_classes = 5
    g = torch.Generator().manual_seed(1)
    labels = torch.cat([torch.randint(0, num_classes, (300,), generator=g), torch.full((900,), num_classes)])
    pos, neg = subsample_labels(labels, 512, 0.25, num_classes)
    _check_valid(labels, pos, neg, bg_label=num_classes)
    # Class 0 counts as a positive when the background label is NUM_CLASSES.
    assert len(pos) == 128 and len(neg) == 384


def test_seeded_and_random():
    labels = _labels(400, 4000, 0)
    torch.manual_seed(0)
    a = subsample_labels(labels, 256, 0.5, 0)
    torch.manual_seed(0)
    b = subsample_labels(labels, 256, 0.5, 0)
    c = subsample_labels(labels, 256, 0.5, 0)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(torch.sort(a[0]).values, torch.sort(c[0]).values)


def test_empty_and_zero_samples():
    pos, neg = subsample_labels(torch.zeros(0, dtype=torch.int64), 256, 0.5, 0)
    assert pos.numel() == 0 and neg.numel() == 0
    pos, neg = subsample_labels(_labels(10, 10, 0), 0, 0.5, 0)
    assert pos.numel() == 0 and neg.numel() == 0


def test_bad_input_raises():
    with pytest.raises(ValueError, match="labels"):
        subsample_labels(torch.zeros(3, 2, dtype=torch.int64), 4, 0.5, 0)
    with pytest.raises(TypeError, match="integer"):
        subsample_labels(torch.zeros(3), 4, 0.5, 0)
    with pytest.raises(ValueError, match="positive_fraction"):
        subsample_labels(torch.zeros(3, dtype=torch.int64), 4, 1.5, 0)
