"""benchmarks/benchmark_export.py runs end to end (its --quick mode: the shapes R-18 model on a small
image) and writes a JSON whose four runtimes carried the same detections."""
import json

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


@pytest.mark.slow
def test_quick_benchmark_writes_its_table(tmp_path):
    from benchmarks import benchmark_export

    record = benchmark_export.main(["--quick", "--repeats", "1", "--output", str(tmp_path / "export.json")])
    saved = json.loads((tmp_path / "export.json").read_text())
    assert saved["median_ms"].keys() == {"eager", "exported_program", "torchscript", "onnxruntime"}
    assert len(set(saved["detections"].values())) == 1 and saved["detections"]["eager"] == 100
    assert all(ms > 0 for ms in record["median_ms"].values())
