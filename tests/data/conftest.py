"""Shared fixtures of the data tests: an isolated cache / data root for every test, tiny COCO
and shapes datasets written under pytest's tmp folders (never in the repo or the home folder)."""
import uuid

import pytest

from detcore.data import DatasetCatalog, MetadataCatalog, register_shapes, set_datasets_root
from detcore.data.datasets import ShapesSpec


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path, monkeypatch):
    """Generated caches and dataset lookups go to this test's tmp folder."""
    monkeypatch.setenv("DETCORE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DETCORE_DATASETS", str(tmp_path / "datasets"))
    set_datasets_root(None)
    yield
    set_datasets_root(None)


@pytest.fixture
def register():
    """``register(name_prefix, fn)`` -> a unique registered name, removed after the test."""
    names = []

    def add(prefix, fn):
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        DatasetCatalog.register(name, fn)
        names.append(name)
        return name

    yield add
    for n in names:
        DatasetCatalog.remove(n)
        MetadataCatalog.remove(n)


@pytest.fixture(scope="session")
def tiny_shapes(tmp_path_factory):
    """A registered 20-image shapes split (64..128 px: both landscape and portrait images)."""
    name = f"test_shapes_{uuid.uuid4().hex[:8]}"
    spec = ShapesSpec(split="train", num_images=20, seed=3, min_size=64, max_size=128)
    register_shapes(name, spec, cache_dir=str(tmp_path_factory.mktemp("shapes_cache")))
    yield name
    DatasetCatalog.remove(name)
    MetadataCatalog.remove(name)
