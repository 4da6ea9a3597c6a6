"""detcore.utils.cache: one cache root for datasets, json conversions and weights, read at each use."""
import os

from detcore.utils.cache import get_cache_dir


def test_the_cache_folder_follows_detcore_cache_at_each_call(monkeypatch, tmp_path):
    monkeypatch.setenv("DETCORE_CACHE", str(tmp_path / "a"))
    assert get_cache_dir() == str(tmp_path / "a")
    monkeypatch.setenv("DETCORE_CACHE", str(tmp_path / "b"))
    assert get_cache_dir() == str(tmp_path / "b")


def test_the_default_is_under_the_home_folder(monkeypatch):
    monkeypatch.delenv("DETCORE_CACHE", raising=False)
    assert get_cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "detcore")
    monkeypatch.setenv("DETCORE_CACHE", "")  # set but empty: the default too
    assert get_cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "detcore")


def test_the_users_of_the_cache_share_this_one_function():
    from detcore.checkpoint import download
    from detcore.data import datasets
    from detcore.evaluation import coco_evaluation

    assert download.get_cache_dir is datasets.get_cache_dir is coco_evaluation.get_cache_dir is get_cache_dir
