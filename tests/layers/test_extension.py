"""What a user sees when detcore._C is missing or was built against another torch."""
import pytest

from detcore.layers import _extension


def _pretend_not_loaded(monkeypatch, error):
    monkeypatch.setattr(_extension, "_loaded", False)
    monkeypatch.setattr(_extension, "_load_error", error)


def test_missing_build_says_how_to_build(monkeypatch):
    _pretend_not_loaded(monkeypatch, ImportError("No module named 'detcore._C'"))
    from detcore.layers import nms

    with pytest.raises(RuntimeError, match=r"(?s)not built.*pip install --no-build-isolation -e \."):
        nms(None, None, 0.5)
    assert not _extension.is_available() and not _extension.cuda_kernels_built()


def test_build_for_another_torch_says_rebuild(monkeypatch):
    _pretend_not_loaded(monkeypatch, ImportError("_C.so: undefined symbol: _ZN3c104impl"))
    from detcore.layers import roi_align

    with pytest.raises(RuntimeError, match=r"(?s)different PyTorch.*Rebuild it"):
        roi_align(None, None, 7)


def test_loaded_here():
    _extension.ensure_loaded()
    assert _extension.is_available()
