"""The exported graph's input rule as the ExportedProgram holds it (input_checks.py), applied the
same way by the .pt2 (torch's guards), TorchScript (a ValueError) and ONNX (a failed run in
onnxruntime), on a small module with a rule like the detector's: uint8, 3 channels, a smallest
height and width, and here a largest width too."""
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from detcore.export import InputContract, input_contracts, program_to_onnx, script_exported_program

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "ignore::DeprecationWarning")

SHAPE = "[3, >=65, 65..500]"
FITS = [(3, 65, 65), (3, 65, 500), (3, 300, 80)]
TOO_SMALL_OR_LARGE = [(3, 64, 100), (3, 100, 64), (3, 1, 1), (3, 100, 501)]


class SidesBetween(nn.Module):
    def forward(self, image):
        height, width = image.shape[1:]
        torch._check((height >= 65) & (width >= 65) & (width <= 500))
        return image.float().mean(0) * 2


def _export(module, example):
    dynamic = {1: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.export(module, (example,), dynamic_shapes=(dynamic,), strict=False)


@pytest.fixture(scope="module")
def program():
    return _export(SidesBetween(), torch.zeros(3, 100, 120, dtype=torch.uint8))


def _image(shape, dtype=torch.uint8):
    return torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(sum(shape))).to(dtype)


def test_the_contract_is_what_the_program_enforces(program):
    (contract,) = input_contracts(program)
    assert contract == InputContract("image", torch.uint8, ((3, 3), (65, None), (65, 500)))
    assert contract.describe() == f"the exported detector takes image as a uint8 tensor of shape {SHAPE}"
    loaded = program.module()
    for shape in FITS:
        assert torch.equal(loaded(_image(shape)), _image(shape).float().mean(0) * 2)
    for shape in TOO_SMALL_OR_LARGE:
        with pytest.raises(AssertionError, match="Guard failed"):
            loaded(_image(shape))


def test_torchscript_refuses_what_the_program_refuses(program):
    scripted = script_exported_program(program)
    for shape in FITS:
        assert torch.equal(scripted(_image(shape))[0], program.module()(_image(shape)))
    for shape in TOO_SMALL_OR_LARGE:
        expected = rf"takes image as a uint8 tensor of shape \[3, >=65, 65..500\], got shape \[{', '.join(map(str, shape))}\]"
        with pytest.raises(Exception, match=expected):
            scripted(_image(shape))
    with pytest.raises(Exception, match=r"shape \[3, >=65, 65..500\], got another dtype"):
        scripted(_image((3, 100, 100), torch.float32))
    with pytest.raises(Exception, match=r"got shape \[4, 100, 100\]"):
        scripted(_image((4, 100, 100)))


def test_onnx_fails_the_run_where_the_program_refuses(program, tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    path = str(tmp_path / "model.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program_to_onnx(program, (_image((3, 100, 120)),)).save(path)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["image"]
    for shape in FITS:
        (got,) = session.run(None, {"image": _image(shape).numpy()})
        np.testing.assert_allclose(got, program.module()(_image(shape)).numpy(), rtol=1e-6)
    for shape in TOO_SMALL_OR_LARGE:
        with pytest.raises(Exception, match=rf"Name:'input check: the exported detector takes image as a uint8 "
                                            rf"tensor of shape \[3, >=65, 65..500\]'"):
            session.run(None, {"image": _image(shape).numpy()})
    # dtype and channels: onnxruntime itself, from the declared input.
    with pytest.raises(Exception, match=r"Unexpected input data type"):
        session.run(None, {"image": _image((3, 100, 100), torch.float32).numpy()})
    with pytest.raises(Exception, match=r"Got invalid dimensions for input: image"):
        session.run(None, {"image": _image((4, 100, 100)).numpy()})


class SquareOnly(nn.Module):
    def forward(self, image):
        torch._check(image.shape[1] == image.shape[2])
        return image.float().mean(0)


def test_sizes_tied_to_each_other_are_not_silently_dropped():
    program = _export(SquareOnly(), torch.zeros(3, 100, 100, dtype=torch.uint8))
    with pytest.raises(NotImplementedError, match=r"image's size 2 is .*, not a size of its own"):
        input_contracts(program)
