import pickle

import pytest
import torch

from detcore.structures.boxes import Boxes
from detcore.structures.instances import Instances
from detcore.structures.masks import PolygonMasks


def make(n=4, image_size=(30, 40), offset=0):
    boxes = torch.arange(n * 4, dtype=torch.float32).reshape(n, 4) + offset
    return Instances(
        image_size,
        pred_boxes=Boxes(boxes),
        scores=torch.linspace(0.1, 0.9, n) + offset,
        pred_classes=torch.arange(n) + offset,
    )


def test_set_get_has_remove_and_attribute_access():
    inst = Instances((30, 40))
    assert len(inst) == 0 and inst.image_size == (30, 40)
    inst.scores = torch.tensor([0.5, 0.7])
    inst.set("labels", ["a", "b"])
    assert inst.has("scores") and inst.has("labels") and not inst.has("pred_boxes")
    assert inst.get("labels") == ["a", "b"]
    assert torch.equal(inst.scores, torch.tensor([0.5, 0.7]))
    assert len(inst) == 2
    inst.remove("labels")
    assert not inst.has("labels")
    del inst.scores
    assert inst.fields() == {}
    with pytest.raises(KeyError, match="labels"):
        inst.remove("labels")


def test_missing_field_error_lists_fields():
    inst = make()
    with pytest.raises(AttributeError, match=r"no field 'gt_boxes'.*pred_boxes"):
        inst.gt_boxes
    assert not hasattr(inst, "gt_masks")


def test_length_mismatch_names_field_and_lengths():
    inst = make(4)
    with pytest.raises(ValueError, match=r"'objectness_logits' has length 3 .*'pred_boxes' has length 4"):
        inst.objectness_logits = torch.zeros(3)
    # Replacing the only field with a different length is allowed; replacing one of several is not.
    single = Instances((1, 1), scores=torch.zeros(2))
    single.scores = torch.zeros(5)
    assert len(single) == 5
    with pytest.raises(ValueError, match="'scores' has length 2"):
        inst.scores = torch.zeros(2)


def test_bad_fields():
    with pytest.raises(TypeError, match="'scores' must have a length"):
        Instances((1, 1), scores=3.0)
    with pytest.raises(ValueError, match="image_size"):
        make().image_size = (1, 1)
    with pytest.raises(ValueError, match="height, width"):
        Instances((1, 2, 3))


def test_getitem_indexes_every_field():
    inst = make(5)
    inst.labels = ["a", "b", "c", "d", "e"]
    inst.gt_masks = PolygonMasks([[[0, 0, i + 1, 0, 0, i + 1]] for i in range(5)])
    keep = inst.scores > 0.4
    for item, expected in (
        (keep, keep.nonzero().flatten().tolist()),
        (torch.tensor([4, 1]), [4, 1]),
        (slice(1, 3), [1, 2]),
        (2, [2]),
        (-1, [4]),
    ):
        sub = inst[item]
        assert isinstance(sub, Instances) and sub.image_size == inst.image_size
        assert len(sub) == len(expected)
        assert sub.pred_classes.tolist() == expected
        assert isinstance(sub.pred_boxes, Boxes)
        assert torch.equal(sub.pred_boxes.tensor, inst.pred_boxes.tensor[expected])
        assert sub.labels == [inst.labels[i] for i in expected]
        assert [p[0][2] for p in sub.gt_masks] == [i + 1 for i in expected]
    with pytest.raises(IndexError, match="out of range"):
        inst[5]


def test_cat():
    a, b = make(2), make(3, offset=100)
    a.labels, b.labels = ["x", "y"], ["p", "q", "r"]
    a.gt_masks = PolygonMasks([[[0, 0, 1, 0, 0, 1]]] * 2)
    b.gt_masks = PolygonMasks([[[0, 0, 2, 0, 0, 2]]] * 3)
    c = Instances.cat([a, b])
    assert len(c) == 5
    assert torch.equal(c.scores, torch.cat([a.scores, b.scores]))
    assert torch.equal(c.pred_boxes.tensor, torch.cat([a.pred_boxes.tensor, b.pred_boxes.tensor]))
    assert c.labels == ["x", "y", "p", "q", "r"]
    assert isinstance(c.gt_masks, PolygonMasks) and len(c.gt_masks) == 5
    assert Instances.cat([a]) is a


def test_cat_errors():
    with pytest.raises(ValueError, match="image_size"):
        Instances.cat([make(image_size=(1, 2)), make(image_size=(2, 1))])
    b = make()
    b.remove("scores")
    with pytest.raises(ValueError, match="fields"):
        Instances.cat([make(), b])
    with pytest.raises(ValueError, match="non-empty"):
        Instances.cat([])


def test_to_moves_tensor_fields():
    inst = make()
    inst.labels = ["a"] * 4
    moved = inst.to("meta")
    assert moved.scores.device.type == "meta"
    assert moved.pred_boxes.device.type == "meta"
    assert moved.labels == inst.labels
    assert inst.scores.device.type == "cpu"


def test_fields_is_a_copy_and_repr_is_short():
    inst = make(1000)
    f = inst.fields()
    assert list(f) == ["pred_boxes", "scores", "pred_classes"]
    f["junk"] = 1
    assert not inst.has("junk")
    text = repr(inst)
    assert "num_instances=1000" in text and "image_height=30" in text and "image_width=40" in text
    assert "pred_boxes: Boxes[1000]" in text and "scores: Tensor[1000] float32" in text
    assert len(text) < 300


def test_pickle_round_trip():
    inst = make()
    back = pickle.loads(pickle.dumps(inst))
    assert back.image_size == inst.image_size
    assert torch.equal(back.scores, inst.scores)
    assert torch.equal(back.pred_boxes.tensor, inst.pred_boxes.tensor)
