"""What a user sees when detcore._C is missing or was built against another torch."""
import os
import subprocess
import sys

import pytest

from detcore.layers import _extension

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def test_a_build_lacking_an_op_counts_as_not_loaded(monkeypatch):
    """A _C built from older sources lacks ops whose fake kernels the Python side registers when
    ``import detcore`` loads it: the import still works, and the first op call says to rebuild."""
    monkeypatch.setattr(_extension, "_loaded", True)
    monkeypatch.setattr(_extension, "_load_error", None)

    def kernel(x):
        return x

    assert _extension._fake("detcore::no_such_op")(kernel) is kernel
    assert not _extension.is_available()
    with pytest.raises(RuntimeError, match=r"(?s)lacks the op detcore::no_such_op.*pip install --no-build-isolation"):
        _extension.ensure_loaded()


def test_import_detcore_works_without_the_extension():
    """``import detcore`` loads the ops; where _C cannot load, the pure-Python parts still import
    and the first op call gives the build hint (a fresh interpreter in which importing _C fails)."""
    code = (
        "import sys\n"
        "class NoExtension:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'detcore._C':\n"
        "            raise ImportError('No module named detcore._C')\n"
        "sys.meta_path.insert(0, NoExtension())\n"
        "import torch, detcore\n"
        "from detcore.config import get_cfg\n"
        "from detcore.structures import Boxes\n"
        "from detcore.layers import nms\n"
        "assert get_cfg().MODEL.ROI_HEADS.NMS_THRESH_TEST > 0 and len(Boxes(torch.zeros(2, 4))) == 2\n"
        "try:\n"
        "    nms(torch.zeros(1, 4), torch.zeros(1), 0.5)\n"
        "except RuntimeError as e:\n"
        "    print('REFUSED:', e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "REFUSED: detcore's compiled extension detcore._C is not built" in done.stdout
    assert "pip install --no-build-isolation -e ." in done.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the ELF dynamic section (Linux)")
def test_the_extension_shares_torchs_cpp_runtime():
    """detcore._C needs libstdc++.so.6, the C++ runtime torch loaded: a copy linked in statically
    (a toolchain with a dangling libstdc++.so, detcore/utils/build_config.py) mixes two runtimes'
    locale state, and an error message with a number in it comes out cut short or crashes."""
    import shutil

    if not _extension.is_available():
        pytest.skip("detcore._C is not built")
    if shutil.which("readelf") is None:
        pytest.skip("needs readelf (binutils)")
    import detcore._C

    dynamic = subprocess.run(["readelf", "-d", detcore._C.__file__], capture_output=True, text=True, check=True).stdout
    assert "[libstdc++.so.6]" in dynamic, dynamic
    from detcore.layers import roi_align
    import torch

    with pytest.raises(ValueError, match=r"got values in \[2, 2\]"):  # numbers formatted whole
        roi_align(torch.zeros(2, 1, 4, 4), torch.tensor([[2.0, 0, 0, 1, 1]]), 1)
