import pytest

from detcore.data import DatasetCatalog, DatasetNotRegisteredError, Metadata, MetadataCatalog


def test_register_get_list(register):
    records = [{"file_name": "a.png", "image_id": 1, "height": 2, "width": 3}]
    name = register("toy", lambda: list(records))
    assert name in DatasetCatalog
    assert name in DatasetCatalog.list()
    assert DatasetCatalog.list() == sorted(DatasetCatalog.list())
    assert DatasetCatalog.get(name) == records


def test_loader_is_called_lazily_and_on_every_get(register):
    calls = []
    name = register("lazy", lambda: calls.append(1) or [])
    assert calls == []
    DatasetCatalog.get(name)
    DatasetCatalog.get(name)
    assert len(calls) == 2


def test_typo_names_the_closest_and_the_registered(register):
    name = register("mytoyset", lambda: [])
    typo = name[:-1]  # drop the last character
    with pytest.raises(KeyError) as e:
        DatasetCatalog.get(typo)
    assert isinstance(e.value, DatasetNotRegisteredError)
    msg = str(e.value)
    assert f"'{typo}' is not registered" in msg
    assert f"Did you mean '{name}'" in msg
    assert "shapes_train" in msg and "coco_2017_val" in msg  # the listing


def test_register_twice_and_bad_arguments(register):
    name = register("dup", lambda: [])
    with pytest.raises(KeyError, match="already registered"):
        DatasetCatalog.register(name, lambda: [])
    with pytest.raises(TypeError, match="callable"):
        DatasetCatalog.register("not_callable_x", [1, 2])
    with pytest.raises(TypeError, match="non-empty str"):
        DatasetCatalog.register("", lambda: [])


def test_loader_must_return_a_list(register):
    name = register("tuple", lambda: ({},))
    with pytest.raises(TypeError, match="must return a list"):
        DatasetCatalog.get(name)


def test_remove(register):
    name = register("gone", lambda: [])
    DatasetCatalog.remove(name)
    assert name not in DatasetCatalog
    DatasetCatalog.register(name, lambda: [])  # the fixture removes it again


def test_metadata_set_get_and_conflicts():
    meta = Metadata("m")
    meta.set(thing_classes=["a", "b"], evaluator_type="coco")
    assert meta.thing_classes == ["a", "b"]
    meta.thing_classes = ["a", "b"]  # same value: fine
    with pytest.raises(ValueError, match="thing_classes"):
        meta.thing_classes = ["a", "c"]
    with pytest.raises(AttributeError, match="has no 'json_file'.*evaluator_type"):
        meta.json_file
    assert meta.get("json_file", "x") == "x"
    assert meta.as_dict() == {"name": "m", "thing_classes": ["a", "b"], "evaluator_type": "coco"}


def test_metadata_lazy_values_are_computed_on_access():
    state = {"root": "/a"}
    meta = Metadata("lazy").set_lazy("json_file", lambda: state["root"] + "/x.json")
    assert meta.json_file == "/a/x.json"
    state["root"] = "/b"
    assert meta.json_file == "/b/x.json"
    assert meta.has("json_file")
    with pytest.raises(AttributeError, match="computed on access"):
        meta.json_file = "/c"


def test_metadata_catalog_creates_on_first_get():
    name = "metadata_catalog_test_name"
    try:
        assert name not in MetadataCatalog
        meta = MetadataCatalog.get(name)
        assert meta.name == name and MetadataCatalog.get(name) is meta
    finally:
        MetadataCatalog.remove(name)
    assert name not in MetadataCatalog


def test_builtin_names_are_registered():
    for name in ["coco_2017_train", "coco_2017_val", "coco_2014_train", "coco_2014_val", "shapes_train", "shapes_val"]:
        assert name in DatasetCatalog
        assert MetadataCatalog.get(name).evaluator_type == "coco"
    assert MetadataCatalog.get("shapes_train").thing_classes == ["circle", "square", "triangle"]
    coco = MetadataCatalog.get("coco_2017_val")
    assert len(coco.thing_classes) == 80 and coco.thing_classes[0] == "person"
    assert coco.thing_dataset_id_to_contiguous_id[90] == 79


def test_check_known_registers_a_data_name_and_refuses_an_unknown_one(tmp_path):
    import json

    from detcore.data import DatasetCatalog
    from detcore.data.catalog import DatasetNotRegisteredError

    ann = tmp_path / "val.json"
    ann.write_text(json.dumps({"images": [], "annotations": [], "categories": [{"id": 1, "name": "a"}]}))
    name = f"coco:{ann}"
    DatasetCatalog.check_known(name)
    try:
        assert name in DatasetCatalog
    finally:
        DatasetCatalog.remove(name)
    with pytest.raises(DatasetNotRegisteredError, match="no_such_dataset"):
        DatasetCatalog.check_known("no_such_dataset")
