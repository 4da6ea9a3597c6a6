"""DefaultTrainer end to end on the toy detector (fast) and on a tiny Mask R-CNN (slow):
outputs, periodic checkpoints and evaluation, resume, NaN stop, SIGKILL + resume, setup."""
import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from detcore.engine import DefaultTrainer, default_setup, seed_all_rng
from detcore.engine.checkpointer import LAST_CHECKPOINT_FILE, load_checkpoint_file
from detcore.engine.divergence import TrainingDiverged, weight_norm
from detcore.engine.train_loop import HookBase
from detcore.utils.plotting import read_metrics

from .toy_model import REPO, TINY_RCNN, TINY_VAL, TOY, ToyDetector, make_cfg, subprocess_env


def toy_cfg(out, *extra):
    cfg = make_cfg(out, TOY + ["SOLVER.BASE_LR", "0.05", "SOLVER.WARMUP_ITERS", "2", "SOLVER.STEPS", "(100,)"] + list(extra))
    cfg.freeze()
    return cfg


def checkpoints(folder):
    return sorted(p for p in os.listdir(folder) if p.endswith(".pth"))


def test_training_run_writes_metrics_checkpoints_eval_and_curves(tiny_cache, tmp_path):
    cfg = toy_cfg(tmp_path, "SOLVER.MAX_ITER", "6", "SOLVER.CHECKPOINT_PERIOD", "2", "LOG_PERIOD", "2", "TEST.EVAL_PERIOD", "3")
    trainer = DefaultTrainer(cfg)
    trainer.resume_or_load(resume=False)
    results = trainer.train()

    assert checkpoints(tmp_path) == ["model_0000001.pth", "model_0000003.pth", "model_final.pth"]
    assert open(tmp_path / LAST_CHECKPOINT_FILE).read() == "model_final.pth"
    final = load_checkpoint_file(str(tmp_path / "model_final.pth"))
    assert final["iteration"] == 5
    assert {"model", "optimizer", "scheduler", "rng_states"} <= set(final)
    assert final["scheduler"]["last_epoch"] == 6

    records = read_metrics(str(tmp_path / "metrics.json"))
    train_lines = [r for r in records if "total_loss" in r]
    # Every LOG_PERIOD (2) iterations, and iteration 2 too: its evaluation's results are written,
    # with whatever else is new, before the next step.
    assert [r["iteration"] for r in train_lines] == [1, 2, 3, 5]
    for r in train_lines:
        assert {"loss_cls", "loss_box_reg", "total_loss", "lr", "time", "data_time"} <= set(r)
    # lr recorded is the one used at that iteration: linear warmup over 2 iterations from 0.001x.
    assert train_lines[0]["lr"] == pytest.approx(0.05 * (0.001 * 0.5 + 0.5))
    eval_lines = [r for r in records if "bbox/AP" in r]
    assert [r["iteration"] for r in eval_lines] == [2, 5]  # after iteration 2 (EVAL_PERIOD 3), and the last
    assert set(results) == {"bbox"} and "AP50" in results["bbox"]
    assert os.path.getsize(tmp_path / "loss_curves.png") > 0
    assert os.path.isfile(tmp_path / "inference" / "tiny_shapes_val" / "coco_eval_metrics.json")


def test_each_checkpoint_iteration_is_in_the_metrics_file_before_its_checkpoint(tiny_cache, tmp_path):
    # A kill right after a checkpoint resumes after its iteration, so that iteration must already
    # be logged, whatever LOG_PERIOD says (here 100: no regular line before the end).
    cfg = toy_cfg(tmp_path, "SOLVER.MAX_ITER", "6", "SOLVER.CHECKPOINT_PERIOD", "2", "LOG_PERIOD", "100",
                  "TEST.EVAL_PERIOD", "2")
    trainer = DefaultTrainer(cfg)
    trainer.resume_or_load(resume=False)
    logged_at_save = {}
    save = trainer.checkpointer.save

    def spying_save(name, **kwargs):
        records = read_metrics(str(tmp_path / "metrics.json"))
        logged_at_save[name] = [r["iteration"] for r in records if "total_loss" in r]
        return save(name, **kwargs)

    trainer.checkpointer.save = spying_save
    trainer.train()
    assert logged_at_save["model_0000001"] == [1]
    assert logged_at_save["model_0000003"] == [1, 3]
    assert logged_at_save["model_final"] == [1, 3, 5]
    records = read_metrics(str(tmp_path / "metrics.json"))
    assert [r["iteration"] for r in records if "total_loss" in r] == [1, 3, 5]
    # Evaluations after those early writes still reach the file, on lines of their own.
    assert [r["iteration"] for r in records if "bbox/AP" in r] == [1, 3, 5]


def test_resume_continues_and_rewrites_redone_metrics(tiny_cache, tmp_path):
    base = ["SOLVER.CHECKPOINT_PERIOD", "2", "LOG_PERIOD", "1", "DATASETS.TEST", "()"]
    first = DefaultTrainer(toy_cfg(tmp_path, "SOLVER.MAX_ITER", "5", *base))
    first.resume_or_load(resume=True)  # nothing there yet: from scratch
    assert first.start_iter == 0
    first.train()

    # Pretend the run died after iteration 3's checkpoint, having logged up to iteration 4.
    (tmp_path / LAST_CHECKPOINT_FILE).write_text("model_0000003.pth")
    saved = load_checkpoint_file(str(tmp_path / "model_0000003.pth"))
    second = DefaultTrainer(toy_cfg(tmp_path, "SOLVER.MAX_ITER", "8", *base))
    second.resume_or_load(resume=True)
    assert second.start_iter == 4
    for k, v in second.model.state_dict().items():
        torch.testing.assert_close(v, saved["model"][k], rtol=0, atol=0)
    assert second.scheduler.last_epoch == saved["scheduler"]["last_epoch"] == 4
    second.train()
    iterations = [r["iteration"] for r in read_metrics(str(tmp_path / "metrics.json")) if "total_loss" in r]
    assert iterations == list(range(8))
    assert load_checkpoint_file(str(tmp_path / "model_final.pth"))["iteration"] == 7


class _Crash(HookBase):
    """Raises before iteration ``at``: a run that died there (its last checkpoint is older)."""

    def __init__(self, at):
        self.at = at

    def before_step(self):
        if self.trainer.iter == self.at:
            raise RuntimeError("crash")


class _Losses(HookBase):
    """Keeps each iteration's total loss as computed (metrics.json has medians over a window)."""

    def __init__(self):
        self.seen = {}

    def after_step(self):
        self.seen[self.trainer.iter] = self.trainer.storage.history("total_loss").latest()


@pytest.mark.parametrize("workers", ["2"])  # 0, 1 and 4: tests/tools/test_chaos_resume.py (slow)
def test_a_resumed_run_is_bit_identical_to_an_uninterrupted_one(tiny_cache, tmp_path, workers):
    # The resumed run must continue the data order, the augmentations and the model's random
    # draws (the toy's dropout) as if it had never stopped; the training stream used to restart
    # from its beginning on resume. The evaluation after iteration 5 draws from the process'
    # RNG in the uninterrupted run only.
    opts = ["SOLVER.MAX_ITER", "9", "SOLVER.CHECKPOINT_PERIOD", "3", "LOG_PERIOD", "1", "TEST.EVAL_PERIOD", "3",
            "DATALOADER.NUM_WORKERS", workers, "INPUT.MIN_SIZE_TRAIN", "(56, 64, 72)"]
    seed_all_rng(7)  # as default_setup does: the same initial weights
    whole = DefaultTrainer(toy_cfg(tmp_path / "whole", *opts))
    whole.resume_or_load(resume=False)
    whole_losses = _Losses()
    whole.register_hooks([whole_losses])
    whole.train()

    seed_all_rng(7)
    cut = DefaultTrainer(toy_cfg(tmp_path / "cut", *opts))
    cut.resume_or_load(resume=False)
    cut.register_hooks([_Crash(at=7)])
    with pytest.raises(RuntimeError, match="crash"):
        cut.train()
    assert (tmp_path / "cut" / LAST_CHECKPOINT_FILE).read_text() == "model_0000005.pth"
    torch.rand(10)  # what the process drew meanwhile does not matter
    resumed = DefaultTrainer(toy_cfg(tmp_path / "cut", *opts))
    resumed.resume_or_load(resume=True)
    assert resumed.start_iter == 6
    resumed_losses = _Losses()
    resumed.register_hooks([resumed_losses])
    resumed.train()

    expected = load_checkpoint_file(str(tmp_path / "whole" / "model_final.pth"))["model"]
    got = load_checkpoint_file(str(tmp_path / "cut" / "model_final.pth"))["model"]
    assert expected.keys() == got.keys()
    for k in expected:
        assert torch.equal(expected[k], got[k]), k
    assert resumed_losses.seen == {i: whole_losses.seen[i] for i in (6, 7, 8)}


def test_a_resumed_run_keeps_its_seed(tiny_cache, tmp_path, caplog):
    # SEED -1 draws a seed: the resumed run must continue with that one, not draw another; an
    # explicit SEED other than the run's is ignored, and the log says so.
    opts = ["SOLVER.MAX_ITER", "4", "SOLVER.CHECKPOINT_PERIOD", "2", "DATASETS.TEST", "()"]
    first = DefaultTrainer(toy_cfg(tmp_path, *opts, "SEED", "-1"))
    first.resume_or_load(resume=False)
    first.register_hooks([_Crash(at=3)])
    with pytest.raises(RuntimeError):
        first.train()
    drawn = first._trainer.seed
    assert first.data_loader.batch_sampler.seed == drawn
    again = DefaultTrainer(toy_cfg(tmp_path, *opts, "SEED", "-1"))
    again.resume_or_load(resume=True)
    assert again._trainer.seed == drawn
    with caplog.at_level(logging.WARNING, logger="detcore.engine.defaults"):
        other = DefaultTrainer(toy_cfg(tmp_path, *opts, "SEED", str(drawn + 1)))
        other.resume_or_load(resume=True)
    assert other._trainer.seed == drawn
    assert f"SEED {drawn + 1} is not used: the resumed run continues with its own seed {drawn}" in caplog.text
    other.train()
    assert other.data_loader.batch_sampler.seed == drawn  # the data stream's too


def test_resume_uses_the_learning_rate_of_the_command_line_and_says_what_changed(tiny_cache, tmp_path, caplog):
    # After a divergence the user resumes with a lower SOLVER.BASE_LR: the resumed run must use
    # it (it used to keep the checkpoint's LR silently), from the resumed iteration on.
    opts = ["SOLVER.MAX_ITER", "6", "SOLVER.CHECKPOINT_PERIOD", "2", "LOG_PERIOD", "1", "DATASETS.TEST", "()"]
    first = DefaultTrainer(toy_cfg(tmp_path, *opts))
    first.resume_or_load(resume=False)
    first.register_hooks([_Crash(at=4)])
    with pytest.raises(RuntimeError, match="crash"):
        first.train()
    lr_before = read_metrics(str(tmp_path / "metrics.json"))[-1]["lr"]
    assert lr_before == pytest.approx(0.05)

    with caplog.at_level(logging.WARNING, logger="detcore.engine.checkpointer"):
        lower = DefaultTrainer(toy_cfg(tmp_path, *opts, "SOLVER.BASE_LR", "0.001", "SOLVER.MOMENTUM", "0.5"))
        lower.resume_or_load(resume=True)
    assert lower.start_iter == 4
    assert [g["lr"] for g in lower.optimizer.param_groups] == [0.001] * len(lower.optimizer.param_groups)
    assert all(g["momentum"] == 0.5 for g in lower.optimizer.param_groups)
    said = caplog.text
    assert "this run's config applies from the resumed iteration on (LR now 0.001)" in said
    assert "base_lrs: [0.05" in said and "-> [0.001" in said and "momentum: 0.9 -> 0.5" in said
    lower.train()
    lrs = {r["iteration"]: r["lr"] for r in read_metrics(str(tmp_path / "metrics.json")) if "lr" in r}
    assert lrs[4] == lrs[5] == 0.001


def test_resume_with_the_same_config_reports_no_change(tiny_cache, tmp_path, caplog):
    opts = ["SOLVER.MAX_ITER", "4", "SOLVER.CHECKPOINT_PERIOD", "2", "DATASETS.TEST", "()"]
    first = DefaultTrainer(toy_cfg(tmp_path, *opts))
    first.resume_or_load(resume=False)
    first.register_hooks([_Crash(at=3)])
    with pytest.raises(RuntimeError):
        first.train()
    with caplog.at_level(logging.WARNING):
        again = DefaultTrainer(toy_cfg(tmp_path, *opts))
        again.resume_or_load(resume=True)
    assert "other solver settings" not in caplog.text and "SEED" not in caplog.text
    saved = load_checkpoint_file(str(tmp_path / "model_0000001.pth"))
    assert again.optimizer.state_dict()["param_groups"] == saved["optimizer"]["param_groups"]


def test_resuming_a_finished_run_evaluates_it_again_and_keeps_its_files(tiny_cache, tmp_path):
    cfg = toy_cfg(tmp_path, "SOLVER.MAX_ITER", "4", "SOLVER.CHECKPOINT_PERIOD", "2", "LOG_PERIOD", "1")
    first = DefaultTrainer(cfg)
    first.resume_or_load(resume=False)
    results = first.train()
    lines = (tmp_path / "metrics.json").read_text()
    final = load_checkpoint_file(str(tmp_path / "model_final.pth"))

    again = DefaultTrainer(cfg)
    again.resume_or_load(resume=True)
    assert again.start_iter == again.max_iter == 4
    assert json.dumps(again.train()) == json.dumps(results)  # the same final model, evaluated again (NaN-safe)
    assert (tmp_path / "metrics.json").read_text() == lines
    for k, v in load_checkpoint_file(str(tmp_path / "model_final.pth"))["model"].items():
        assert torch.equal(v, final["model"][k])


def test_nan_loss_stops_training_and_keeps_last_good_checkpoint(tiny_cache, tmp_path, monkeypatch):
    real_forward = ToyDetector.forward
    calls = {"n": 0}
    snapshot = {}

    def forward(self, batched_inputs):
        losses = real_forward(self, batched_inputs)
        if self.training:
            calls["n"] += 1
            if calls["n"] == 6:  # iteration 5
                snapshot.update({k: v.detach().clone() for k, v in self.state_dict().items()})
                losses["loss_box_reg"] = losses["loss_box_reg"] * float("nan")
        return losses

    monkeypatch.setattr(ToyDetector, "forward", forward)
    trainer = DefaultTrainer(toy_cfg(tmp_path, "SOLVER.MAX_ITER", "20", "SOLVER.CHECKPOINT_PERIOD", "2", "LOG_PERIOD", "1"))
    trainer.resume_or_load(resume=False)
    with pytest.raises(FloatingPointError) as info:
        trainer.train()
    assert "iteration=5" in str(info.value) and "loss_box_reg" in str(info.value)
    assert "loss_cls" not in str(info.value)
    assert checkpoints(tmp_path) == ["model_0000001.pth", "model_0000003.pth"]
    assert open(tmp_path / LAST_CHECKPOINT_FILE).read() == "model_0000003.pth"
    for k, v in trainer.model.state_dict().items():
        torch.testing.assert_close(v, snapshot[k], rtol=0, atol=0)
    # No evaluation ran, and the metrics stop at the last good iteration.
    records = read_metrics(str(tmp_path / "metrics.json"))
    assert max(r["iteration"] for r in records) == 4
    assert not any("bbox/AP" in r for r in records)


@pytest.mark.parametrize("clip", ["True", "False"])
def test_after_a_divergence_resume_with_a_lower_learning_rate_trains_on(tiny_cache, tmp_path, clip):
    # SOLVER.BASE_LR 1e6 once ended with a message naming no loss and a last checkpoint of NaN
    # weights (clipping infinite gradients writes NaN): --resume then failed at once. Later the
    # last checkpoint held finite but exploded weights, and --resume with a sane LR kept the
    # checkpoint's LR: it diverged again at once.
    opts = ["SOLVER.MAX_ITER", "30", "LOG_PERIOD", "1", "SOLVER.WARMUP_ITERS", "0",
            "SOLVER.CLIP_GRADIENTS.ENABLED", clip, "DATASETS.TEST", "()"]
    trainer = DefaultTrainer(toy_cfg(tmp_path, *opts, "SOLVER.BASE_LR", "1e6", "SOLVER.CHECKPOINT_PERIOD", "1"))
    trainer.resume_or_load(resume=False)
    with pytest.raises(TrainingDiverged, match=r"iteration=\d+.*(loss|weights).*--resume SOLVER\.BASE_LR <lower>"):
        trainer.train()
    for name in checkpoints(tmp_path):
        for k, v in load_checkpoint_file(str(tmp_path / name))["model"].items():
            assert torch.isfinite(v).all(), (name, k)
    again = DefaultTrainer(toy_cfg(tmp_path, *opts, "SOLVER.BASE_LR", "0.05", "SOLVER.CHECKPOINT_PERIOD", "30"))
    again.resume_or_load(resume=True)
    if again.start_iter > 0:  # the last good state: weights within the bound
        assert weight_norm(list(again.model.parameters())) <= 10 * again._trainer.guard.first_weight_norm
    again.train()  # no divergence this time
    assert load_checkpoint_file(str(tmp_path / "model_final.pth"))["iteration"] == 29


@pytest.mark.parametrize("nan_at, good", [(4, "model_0000001.pth"), (2, None)])
def test_a_checkpoint_whose_weights_diverged_at_the_next_step_is_set_aside(tiny_cache, tmp_path, monkeypatch, caplog, nan_at, good):
    # The checkpoint written after iteration nan_at - 1 holds the weights that gave iteration
    # nan_at its NaN loss: resumed, they would meet the same loss on the same batch whatever the
    # learning rate. last_checkpoint goes back to the checkpoint before (none: the run's start).
    real_forward = ToyDetector.forward
    calls = {"n": 0}

    def forward(self, batched_inputs):
        losses = real_forward(self, batched_inputs)
        if self.training:
            calls["n"] += 1
            if calls["n"] == nan_at + 1:
                losses["loss_cls"] = losses["loss_cls"] * float("nan")
        return losses

    monkeypatch.setattr(ToyDetector, "forward", forward)
    cfg = toy_cfg(tmp_path, "SOLVER.MAX_ITER", "8", "SOLVER.CHECKPOINT_PERIOD", "2", "DATASETS.TEST", "()")
    trainer = DefaultTrainer(cfg)
    trainer.resume_or_load(resume=False)
    with pytest.raises(TrainingDiverged, match=f"iteration={nan_at}"):
        trainer.train()
    set_aside = f"model_{nan_at - 1:07d}.pth"
    assert set_aside in checkpoints(tmp_path)  # the file stays
    pointer = tmp_path / LAST_CHECKPOINT_FILE
    assert (pointer.read_text() if pointer.exists() else None) == good
    assert f"{set_aside} holds the weights that diverged at iteration {nan_at}" in caplog.text
    monkeypatch.setattr(ToyDetector, "forward", real_forward)
    again = DefaultTrainer(cfg)
    again.resume_or_load(resume=True)
    assert again.start_iter == (0 if good is None else 2)
    again.train()


def test_sigkill_then_resume_restores_the_saved_state(tiny_cache, tmp_path):
    out = tmp_path / "run"
    args = [
        sys.executable, os.path.join(REPO, "tests", "tools", "launcher.py"), os.path.join(REPO, "tools", "train_net.py"),
        "--config-file", os.path.join(REPO, "configs", "e2e_mask_rcnn_R_18_FPN_shapes.yaml"),
        *TOY, "SOLVER.BASE_LR", "0.05", "SOLVER.WARMUP_ITERS", "2", "SOLVER.STEPS", "(100,)",  # toy_cfg's
        "SOLVER.MAX_ITER", "100000", "SOLVER.CHECKPOINT_PERIOD", "4", "LOG_PERIOD", "1",
        "DATASETS.TEST", "()", "OUTPUT_DIR", str(out),
    ]
    proc = subprocess.Popen(args, env=subprocess_env(tiny_cache), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pointer = out / LAST_CHECKPOINT_FILE
    try:
        deadline = time.time() + 120
        # Wait for the second checkpoint, so that one checkpoint was replaced by another.
        while not (pointer.exists() and pointer.read_text() >= "model_0000007.pth"):
            if proc.poll() is not None:
                pytest.fail(f"training exited early ({proc.returncode}):\n{proc.stderr.read().decode()[-3000:]}")
            if time.time() > deadline:
                pytest.fail("no second checkpoint within 120 s")
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL

    saved_path = out / pointer.read_text()
    saved = load_checkpoint_file(str(saved_path))  # complete, whenever the kill landed
    trainer = DefaultTrainer(toy_cfg(out, "SOLVER.MAX_ITER", str(saved["iteration"] + 3), "SOLVER.CHECKPOINT_PERIOD", "4",
                                     "LOG_PERIOD", "1", "DATASETS.TEST", "()"))
    trainer.resume_or_load(resume=True)
    assert trainer.start_iter == saved["iteration"] + 1
    for k, v in trainer.model.state_dict().items():
        torch.testing.assert_close(v, saved["model"][k], rtol=0, atol=0)
    opt_state = trainer.optimizer.state_dict()
    assert opt_state["param_groups"] == saved["optimizer"]["param_groups"]
    for idx, state in saved["optimizer"]["state"].items():
        torch.testing.assert_close(opt_state["state"][idx]["momentum_buffer"], state["momentum_buffer"], rtol=0, atol=0)
    assert trainer.scheduler.last_epoch == saved["iteration"] + 1

    trainer.train()
    final = load_checkpoint_file(str(out / "model_final.pth"))
    assert final["iteration"] == saved["iteration"] + 2
    iterations = [r["iteration"] for r in read_metrics(str(out / "metrics.json")) if "total_loss" in r]
    assert iterations == list(range(saved["iteration"] + 3))  # redone iterations not duplicated


def test_default_setup_writes_config_log_and_seeds(tmp_path):
    out = tmp_path / "setup"
    cfg = make_cfg(out, ["SEED", "-1"])
    cfg.freeze()
    default_setup(cfg)
    logging.getLogger("detcore.test").info("hello from the test")
    assert (out / "config.yaml").read_text() == cfg.dump()
    log = (out / "log.txt").read_text()
    assert "hello from the test" in log
    assert "Random seed of this process:" in log and "drawn at random" in log
    assert "Full config:" in log and "Environment:" in log

    cfg2 = make_cfg(tmp_path / "setup2", ["SEED", "123"])
    default_setup(cfg2)
    a = torch.rand(3)
    default_setup(cfg2)
    torch.testing.assert_close(torch.rand(3), a, rtol=0, atol=0)  # same seed, same stream


def test_resume_and_start_over_together_are_refused(capsys):
    # Together, one was silently ignored (--resume won).
    from detcore.engine import default_argument_parser

    with pytest.raises(SystemExit) as info:
        default_argument_parser().parse_args(["--config-file", "x.yaml", "--resume", "--start-over"])
    assert info.value.code == 2
    assert "argument --start-over: not allowed with argument --resume" in capsys.readouterr().err
    args = default_argument_parser().parse_args(["--config-file", "x.yaml", "--eval-only", "--resume", "OUTPUT_DIR", "o"])
    assert (args.resume, args.start_over, args.eval_only, args.opts) == (True, False, True, ["OUTPUT_DIR", "o"])


@pytest.mark.slow
def test_tiny_mask_rcnn_loss_decreases(tiny_cache, tmp_path):
    cfg = make_cfg(tmp_path, TINY_RCNN + [
        "SOLVER.MAX_ITER", "20", "SOLVER.BASE_LR", "0.01", "SOLVER.WARMUP_ITERS", "2", "SOLVER.STEPS", "(100,)",
        "SOLVER.CHECKPOINT_PERIOD", "100", "LOG_PERIOD", "5", "DATASETS.TEST", "()",
    ])
    cfg.freeze()
    trainer = DefaultTrainer(cfg)
    trainer.resume_or_load(resume=False)
    trainer.train()
    losses = [v for v, _ in trainer.storage.history("total_loss").values()]
    assert len(losses) == 20 and all(map(lambda v: v == v, losses))
    first, last = sum(losses[:3]) / 3, sum(losses[-5:]) / 5
    assert last < 0.85 * first, losses
    assert checkpoints(tmp_path) == ["model_final.pth"]
    lines = [json.loads(line) for line in open(tmp_path / "metrics.json")]
    assert {"loss_rpn_cls", "loss_rpn_loc", "loss_cls", "loss_box_reg", "loss_mask"} <= set(lines[-1])


def test_evaluation_results_reach_every_writer_before_the_next_step(tiny_cache, tmp_path, monkeypatch):
    # The writer runs before the checkpointer and the evaluation after it; what the evaluation
    # put into the storage must be on disk before training goes on (a kill then would lose it for
    # good: the resumed run starts after the checkpoint and does not evaluate again), and in
    # TensorBoard, whose writer once skipped values older than the newest it had written.
    cfg = toy_cfg(tmp_path, "SOLVER.MAX_ITER", "5", "SOLVER.CHECKPOINT_PERIOD", "2", "LOG_PERIOD", "100",
                  "TEST.EVAL_PERIOD", "2")
    trainer = DefaultTrainer(cfg)
    trainer.resume_or_load(resume=False)
    on_disk_at_step = {}
    run_step = trainer.run_step

    def spying_step():
        records = read_metrics(str(tmp_path / "metrics.json"))
        on_disk_at_step[trainer.iter] = [r["iteration"] for r in records if "bbox/AP" in r]
        run_step()

    monkeypatch.setattr(trainer, "run_step", spying_step)
    trainer.train()
    assert on_disk_at_step[2] == [1] and on_disk_at_step[4] == [1, 3]
    records = read_metrics(str(tmp_path / "metrics.json"))
    assert [r["iteration"] for r in records if "bbox/AP" in r] == [1, 3, 4]
    assert [r["iteration"] for r in records if "total_loss" in r] == [1, 3, 4]

    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    events = event_accumulator.EventAccumulator(str(tmp_path))
    events.Reload()
    assert [e.step for e in events.Scalars("bbox/AP")] == [1, 3, 4]
    assert [e.step for e in events.Scalars("total_loss")] == [1, 3, 4]


def test_evaluation_with_test_time_augmentation(tiny_cache, tmp_path, monkeypatch, single_thread):
    """TEST.AUG.ENABLED: the trainer's evaluation runs the TTA wrapper on unresized images and
    writes its results beside the plain ones, under <dataset>_TTA."""
    from detcore.modeling import GeneralizedRCNNWithTTA

    opts = ["TEST.AUG.ENABLED", "True", "TEST.AUG.MIN_SIZES", "(48, 64)", "TEST.AUG.MAX_SIZE", "96",
            "MODEL.ROI_HEADS.SCORE_THRESH_TEST", "0.0"]
    cfg = make_cfg(tmp_path, TINY_RCNN + opts)
    cfg.freeze()
    torch.manual_seed(0)
    model = DefaultTrainer.build_model(cfg)
    seen = []
    augment = GeneralizedRCNNWithTTA.augment

    def spy(self, image, orig_size):
        seen.append((image.shape[:2], orig_size))
        return augment(self, image, orig_size)

    monkeypatch.setattr(GeneralizedRCNNWithTTA, "augment", spy)
    results = DefaultTrainer.test(cfg, model)
    assert set(results) == {"bbox", "segm"}
    assert len(seen) == 6 and all(tuple(shape) == size for shape, size in seen)
    assert (tmp_path / "inference" / f"{TINY_VAL}_TTA" / "coco_eval_metrics.json").is_file()
    assert model.training  # the model's mode is left as it was


def test_keypoint_rcnn_trains_and_is_scored_for_keypoints_next_to_boxes(tmp_path, single_thread):
    """MODEL.KEYPOINT_ON: the trainer reads keypoints (flipped with the dataset's pairs) from a
    COCO-format keypoint dataset, and its evaluation reports keypoint AP (OKS with the dataset's
    sigmas) beside box AP."""
    from detcore.data import DatasetCatalog, MetadataCatalog, register_figures
    from detcore.data.datasets import FiguresSpec

    names = [f"kp_e2e_figures_{split}_{os.getpid()}" for split in ("train", "val")]
    for name, split, seed in zip(names, ("train", "val"), (5, 6)):
        register_figures(name, FiguresSpec(split=split, num_images=4, seed=seed, min_size=64, max_size=96), str(tmp_path / "data"))
    try:
        cfg = make_cfg(tmp_path / "run", [
            "DATASETS.TRAIN", f"('{names[0]}',)", "DATASETS.TEST", f"('{names[1]}',)",
            "MODEL.FPN.OUT_CHANNELS", "32", "MODEL.ROI_BOX_HEAD.FC_DIM", "32", "MODEL.ROI_KEYPOINT_HEAD.CONV_DIMS", "[32]",
            "MODEL.ROI_HEADS.SCORE_THRESH_TEST", "0.0", "SOLVER.MAX_ITER", "2", "SOLVER.WARMUP_ITERS", "1",
            "SOLVER.STEPS", "(100,)", "DATALOADER.NUM_WORKERS", "0", "INPUT.MIN_SIZE_TRAIN", "(64,)",
            "INPUT.MIN_SIZE_TEST", "64",
        ], config_file=os.path.join(REPO, "configs", "keypoint_rcnn_R_18_FPN_figures.yaml"))
        cfg.freeze()
        trainer = DefaultTrainer(cfg)
        trainer.resume_or_load(resume=False)
        results = trainer.train()
    finally:
        for name in names:
            DatasetCatalog.remove(name)
            MetadataCatalog.remove(name)
    assert set(results) == {"bbox", "keypoints"}
    assert {"AP", "AP50", "AP75", "APm", "APl"} <= set(results["keypoints"]) and "APs" not in results["keypoints"]
    records = read_metrics(str(tmp_path / "run" / "metrics.json"))
    assert any("loss_keypoint" in r for r in records) and any("keypoints/AP" in r for r in records)
