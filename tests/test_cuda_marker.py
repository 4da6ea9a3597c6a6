"""Every test file that puts tensors or models on a CUDA device carries the `cuda` marker
(pytest.ini), so that `pytest -m cuda` -- the GPU check's step 2 (scripts/gpu_check.sh) --
selects every test that needs a GPU, and skips none of them there unseen."""
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# A device argument or a move to the GPU: .cuda(), device="cuda", .to("cuda"), torch.device("cuda").
USES_CUDA = re.compile(r"""\.cuda\(|device\s*=\s*["']cuda|\.to\(\s*["']cuda|torch\.device\(\s*["']cuda""")
MARKED = re.compile(r"pytest\.mark\.cuda\b")


def files_using_cuda_without_marker(paths):
    return [p for p in paths if USES_CUDA.search(p.read_text()) and not MARKED.search(p.read_text())]


def test_every_file_using_cuda_is_marked():
    unmarked = files_using_cuda_without_marker(sorted(TESTS.rglob("test_*.py")))
    assert not unmarked, "mark these with pytest.mark.cuda (pytestmark): " + ", ".join(
        str(p.relative_to(TESTS)) for p in unmarked)


def test_the_check_sees_a_device_argument(tmp_path):
    """The check itself: an unmarked file that moves a tensor to the GPU is found; marked, it is not."""
    uses = tmp_path / "test_uses.py"
    uses.write_text('import torch\n\ndef test_x():\n    torch.ones(1, device="cuda")\n')
    marked = tmp_path / "test_marked.py"
    marked.write_text("import pytest\npytestmark = pytest.mark.cuda\n\ndef test_x(t):\n    t.cuda()\n")
    plain = tmp_path / "test_plain.py"
    plain.write_text('def test_x(cfg):\n    cfg.merge_from_list(["MODEL.DEVICE", "cuda:3"])\n')
    assert files_using_cuda_without_marker([uses, marked, plain]) == [uses]
