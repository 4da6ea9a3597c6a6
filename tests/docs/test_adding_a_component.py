"""docs/adding_a_component.md's examples run as written: its backbone and ROI head build a model
through the registries and detect on an image (in a fresh interpreter, as a user's script)."""
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "adding_a_component.md"

CHECK = """
import torch
from tests.modeling.small_config import small_cfg
from detcore.modeling import build_model
cfg = small_cfg(**{
    "MODEL.BACKBONE.NAME": "TwoConvBackbone", "MODEL.FPN.OUT_CHANNELS": 16,
    "MODEL.RPN.IN_FEATURES": ["c1", "c2"], "MODEL.ANCHOR_GENERATOR.SIZES": [[8], [16]],
    "MODEL.ROI_HEADS.IN_FEATURES": ["c1", "c2"], "MODEL.ROI_HEADS.NAME": "FewerROIsHeads",
    "MODEL.ROI_HEADS.CANONICAL_LEVEL": 2, "MODEL.CHANNELS_LAST": False,
})
model = build_model(cfg).eval()
assert type(model.backbone).__name__ == "TwoConvBackbone"
assert model.roi_heads.batch_size_per_image == 128
with torch.no_grad():
    out = model([{"image": torch.randint(0, 255, (3, 64, 80), dtype=torch.uint8)}])
print("detections", len(out[0]["instances"]))
"""


def test_the_guide_examples_build_and_run_a_model():
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert len(blocks) == 2, "the guide's two Python examples"
    code = "\n".join(blocks) + CHECK
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "detections" in result.stdout
