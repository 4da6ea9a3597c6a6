import pytest
import torch

from detcore.modeling.matcher import Matcher


def _reference_match(quality, thresholds, labels, allow_low_quality):
    """Plain-Python matcher: argmax GT, interval label, then each GT's best predictions -> 1."""
    m, n = quality.shape
    q = quality.tolist()
    matches, out = [], []
    for j in range(n):
        col = [q[i][j] for i in range(m)]
        best = max(col)
        matches.append(col.index(best))
        label = labels[0]
        for t, lab in zip(thresholds, labels[1:]):
            if best >= t:
                label = lab
        out.append(label)
    if allow_low_quality:
        for i in range(m):
            best = max(q[i])
            if best > 0:
                for j in range(n):
                    if q[i][j] == best:
                        out[j] = 1
    return torch.tensor(matches, dtype=torch.int64), torch.tensor(out, dtype=torch.int8)


def test_threshold_bands_and_boundaries():
    matcher = Matcher([0.3, 0.7], [0, -1, 1])
    quality = torch.tensor(
        [
            [0.0, 0.29, 0.3, 0.5, 0.69, 0.7, 0.95, 0.1],
            [0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.8],
        ]
    )
    matches, labels = matcher(quality)
    assert matches.dtype == torch.int64 and labels.dtype == torch.int8
    # A value on a threshold belongs to the band above it.
    assert labels.tolist() == [0, 0, -1, -1, -1, 1, 1, 1]
    assert matches.tolist() == [1, 0, 0, 0, 0, 0, 0, 1]


def test_single_threshold_roi_style():
    matches, labels = Matcher([0.5], [0, 1])(torch.tensor([[0.2, 0.5, 0.9]]))
    assert labels.tolist() == [0, 1, 1]
    assert matches.tolist() == [0, 0, 0]


def test_low_quality_matches_make_best_anchor_positive():
    quality = torch.tensor(
        [
            [0.40, 0.10, 0.35, 0.0],  # best 0.40, below 0.7: only anchor 0 is rescued
            [0.00, 0.20, 0.00, 0.05],  # best 0.20: anchor 1
        ]
    )
    _, without = Matcher([0.3, 0.7], [0, -1, 1])(quality)
    assert without.tolist() == [-1, 0, -1, 0]
    matches, with_lq = Matcher([0.3, 0.7], [0, -1, 1], allow_low_quality_matches=True)(quality)
    assert with_lq.tolist() == [1, 1, -1, 0]
    assert matches.tolist() == [0, 1, 0, 1]


def test_low_quality_matches_include_ties():
    quality = torch.tensor([[0.25, 0.1, 0.25, 0.25], [0.0, 0.6, 0.0, 0.6]])
    _, labels = Matcher([0.3, 0.7], [0, -1, 1], allow_low_quality_matches=True)(quality)
    assert labels.tolist() == [1, 1, 1, 1]


def test_gt_overlapping_nothing_does_not_rescue_everything():
    quality = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.8, 0.1]])
    _, labels = Matcher([0.3, 0.7], [0, -1, 1], allow_low_quality_matches=True)(quality)
    assert labels.tolist() == [0, 1, 0]


def test_zero_ground_truth():
    matches, labels = Matcher([0.3, 0.7], [0, -1, 1], True)(torch.zeros(0, 5))
    assert matches.tolist() == [0] * 5 and matches.dtype == torch.int64
    assert labels.tolist() == [0] * 5 and labels.dtype == torch.int8


def test_zero_predictions():
    matches, labels = Matcher([0.3, 0.7], [0, -1, 1], True)(torch.zeros(3, 0))
    assert matches.shape == (0,) and labels.shape == (0,)


@pytest.mark.parametrize("allow_low_quality", [False, True])
def test_matches_reference_on_random_matrices(allow_low_quality):
    g = torch.Generator().manual_seed(0)
    for m in (1, 3, 7):
        # Rounded values make ties common.
        quality = (torch.rand(m, 50, generator=g, dtype=torch.float64) * 20).round() / 20
        ours = Matcher([0.3, 0.7], [0, -1, 1], allow_low_quality)(quality)
        ref = _reference_match(quality, [0.3, 0.7], [0, -1, 1], allow_low_quality)
        # Argmax ties may resolve to either GT; the best quality must agree.
        best = quality.max(dim=0).values
        torch.testing.assert_close(quality[ours[0], torch.arange(50)], best)
        assert torch.equal(ours[1], ref[1])


def test_invalid_arguments():
    with pytest.raises(ValueError, match="increasing"):
        Matcher([0.7, 0.3], [0, -1, 1])
    with pytest.raises(ValueError, match="labels"):
        Matcher([0.3, 0.7], [0, 1])
    with pytest.raises(ValueError, match="-1, 0 or 1"):
        Matcher([0.5], [0, 2])
    with pytest.raises(ValueError, match="match_quality_matrix"):
        Matcher([0.5], [0, 1])(torch.zeros(4))
