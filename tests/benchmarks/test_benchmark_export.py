"""benchmarks/benchmark_export.py runs end to end (its --quick mode: the shapes R-18 model on a small
image): every row of the deploy table carried the same 100 detections, has a latency, a throughput
and a peak memory, and the ratios are to torchvision's eager row."""
import json

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
pytest.importorskip("openvino")
pytest.importorskip("nncf")
pytest.importorskip("torchvision")


@pytest.mark.slow
def test_quick_benchmark_writes_its_table(tmp_path):
    from benchmarks import benchmark_export, deploy_rows

    record = benchmark_export.main(["--quick", "--repeats", "1", "--batch", "2", "--output", str(tmp_path / "export.json")])
    saved = json.loads((tmp_path / "export.json").read_text())
    rows = saved["rows"]
    assert list(rows) == list(deploy_rows.ROWS)
    assert {r["detections"] for r in rows.values()} == {100}
    for r in rows.values():
        assert r["latency_ms"] > 0 and r["throughput_images_per_s"] > 0
        assert r["peak_memory_mb"] > r["memory_growth_mb"] > 0
    assert saved["latency_relative_to_torchvision_eager"]["torchvision_eager"] == 1.0
    assert record["rows"].keys() == rows.keys()


def test_rows_whose_packages_are_missing_are_refused_before_any_export(monkeypatch, capsys):
    import importlib.util

    from benchmarks import benchmark_export, deploy_rows

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real_find_spec(name, *a))
    assert deploy_rows.missing_packages(["eager", "exported_program"]) == []
    assert deploy_rows.missing_packages(["eager", "openvino_int8"]) == ["openvino"]
    with pytest.raises(SystemExit):
        benchmark_export.parse_args(["--rows", "eager", "openvino"])
    assert "need openvino: pip install openvino" in capsys.readouterr().err
