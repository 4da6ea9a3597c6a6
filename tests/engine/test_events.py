"""EventStorage smoothing, the JSON-lines writer (incl. resume truncation) and the console line."""
import json
import logging

import pytest

from detcore.engine.events import CommonMetricPrinter, EventStorage, JSONWriter, TensorboardWriter, get_event_storage


def test_storage_latest_and_smoothing():
    with EventStorage(start_iter=0) as storage:
        assert get_event_storage() is storage
        for it, v in enumerate([5.0, 1.0, 3.0, 100.0]):
            storage.iter = it
            storage.put_scalar("loss", v)
            storage.put_scalar("lr", v / 10, smoothing_hint=False)
        assert storage.latest()["loss"] == (100.0, 3)
        smoothed = storage.latest_with_smoothing_hint(window_size=3)
        assert smoothed["loss"] == (3.0, 3)  # median of 1, 3, 100
        assert smoothed["lr"] == (10.0, 3)  # not smoothed
        assert storage.history("loss").global_avg() == pytest.approx(27.25)
        with pytest.raises(ValueError, match="smoothing_hint"):
            storage.put_scalar("lr", 1.0)
    with pytest.raises(RuntimeError, match="EventStorage"):
        get_event_storage()


def test_json_writer_lines_and_resume_truncation(tmp_path):
    path = str(tmp_path / "metrics.json")
    writer = JSONWriter(path, window_size=1)
    with EventStorage(0) as storage:
        for it in range(6):
            storage.iter = it
            storage.put_scalars(total_loss=10.0 - it, loss_a=1.0)
            storage.put_scalar("lr", 0.1, smoothing_hint=False)
            if it % 2 == 1:
                writer.write()
    writer.close()
    lines = [json.loads(line) for line in open(path)]
    assert [r["iteration"] for r in lines] == [1, 3, 5]
    assert lines[1] == {"iteration": 3, "total_loss": 7.0, "loss_a": 1.0, "lr": 0.1}

    # A run killed after iteration 5 resumes from a checkpoint of iteration 2: lines >= 3 go,
    # and a line cut short by the kill is dropped too.
    with open(path, "a") as f:
        f.write('{"iteration": 6, "total_lo')
    writer = JSONWriter(path)
    writer.resume_from(3)
    with EventStorage(3) as storage:
        storage.put_scalar("total_loss", 0.5)
        writer.write()
    writer.close()
    on_disk = [json.loads(line) for line in open(path)]
    assert [r["iteration"] for r in on_disk] == [1, 3]
    assert writer.records == on_disk  # the in-memory history is the file's


def test_json_writer_writes_late_scalars_of_a_written_iteration_once(tmp_path):
    # The trainer writes an iteration's losses before its checkpoint; an evaluation of that
    # iteration comes after, and must still reach the file (once, and without the losses again).
    path = str(tmp_path / "metrics.json")
    writer = JSONWriter(path, window_size=1)
    with EventStorage(0) as storage:
        storage.iter = 4
        storage.put_scalar("total_loss", 2.0)
        writer.write()
        storage.put_scalar("bbox/AP", 31.5, smoothing_hint=False)
        writer.write()
        writer.write()  # nothing new
    writer.close()
    lines = [json.loads(line) for line in open(path)]
    assert lines == [{"iteration": 4, "total_loss": 2.0}, {"iteration": 4, "bbox/AP": 31.5}]


def test_metric_printer_line(caplog):
    printer = CommonMetricPrinter(max_iter=101, window_size=20)
    with EventStorage(0) as storage, caplog.at_level(logging.INFO, logger="detcore.engine.train"):
        for it in range(10):
            storage.iter = it
            storage.put_scalars(total_loss=2.0, loss_cls=1.5, time=0.5, data_time=0.1)
            storage.put_scalar("lr", 0.02, smoothing_hint=False)
        printer.write()
    line = caplog.records[-1].getMessage()
    # 91 iterations left at 0.5 s each.
    assert "eta: 0:00:45" in line
    assert "iter: 10/101" in line
    assert "total_loss: 2.0000" in line and "loss_cls: 1.5000" in line
    assert "time: 0.5000" in line and "data_time: 0.1000" in line and "lr: 0.02" in line
    assert line.index("total_loss") < line.index("loss_cls")


def test_tensorboard_is_optional(tmp_path):
    pytest.importorskip("torch.utils.tensorboard", reason="tensorboard is not installed")
    writer = TensorboardWriter.create(str(tmp_path))
    with EventStorage(0) as storage:
        storage.put_scalar("loss", 1.0)
        writer.write()
    writer.close()
    assert any(p.name.startswith("events.out.tfevents") for p in tmp_path.iterdir())


def test_tensorboard_missing_gives_none(monkeypatch, tmp_path):
    import builtins

    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith("torch.utils.tensorboard") or name.startswith("tensorboard"):
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    assert TensorboardWriter.create(str(tmp_path)) is None
