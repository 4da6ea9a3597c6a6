"""The Checkpointer: crash-safe saving, resuming a run, and loading model weights with a report
(the checkpoint formats it reads, the model zoo catalog and downloads live in detcore/checkpoint/).

Saving is atomic: the checkpoint is written to a temporary file in the same folder, flushed and
fsynced, then renamed over the final name (``os.replace``, atomic on POSIX), and only then is the
``last_checkpoint`` pointer replaced the same way. A process killed at any moment leaves either
the previous checkpoint or the new one, never a torn file, and the pointer always names a
complete checkpoint.

Every file is read as detcore reads any checkpoint (``detcore.checkpoint.io``): judged by type,
then ``torch.load(weights_only=True)``: only tensors and plain containers are unpickled, so a
checkpoint cannot run code or allocate by a number it declares. That is why RNG states are stored as tensors and
tuples (``detcore.utils.comm.rng_states``) and no config object is pickled.

``load_model_weights(model, path)`` is the one entry point for initializing a model from a file
(MODEL.WEIGHTS, the predictor, test_net); it reads and converts through detcore.checkpoint, so
torchvision and detectron2 checkpoints work too, and model zoo names and URLs are downloaded.
"""
import contextlib
import glob
import logging
import os
import shutil
import signal
import tempfile
import threading
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import nn

from detcore.checkpoint import LoadReport, convert_state_dict, load_converted_state_dict
from detcore.checkpoint.io import load_checkpoint_object
from detcore.checkpoint.model_zoo import resolve_weights
from detcore.solver.resume import load_optimizer_state, load_scheduler_state
from detcore.utils import comm

__all__ = [
    "Checkpointer",
    "LoadReport",
    "atomic_torch_save",
    "load_checkpoint_file",
    "load_model_weights",
    "LAST_CHECKPOINT_FILE",
]

logger = logging.getLogger(__name__)

LAST_CHECKPOINT_FILE = "last_checkpoint"


# --- atomic writes --------------------------------------------------------------------------------
def _fsync_dir(path: str) -> None:
    # The rename itself must reach the disk too, or a power loss can undo it.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _atomic_write(path: str, write: Callable[[Any], None], mode: str = "wb") -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_current_umask())  # mkstemp makes 0600; give what open() would
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(folder)


def atomic_torch_save(obj: Any, path: str) -> None:
    """``torch.save(obj, path)`` that never leaves a partial file at ``path``."""
    _atomic_write(path, lambda f: torch.save(obj, f))


def _atomic_write_text(path: str, text: str) -> None:
    _atomic_write(path, lambda f: f.write(text), mode="w")


@contextlib.contextmanager
def _ctrl_c_deferred(path: str):
    """Let a checkpoint write finish before Ctrl-C stops the process: an interrupt that arrives
    meanwhile is held and raised right after, with a message saying the file is complete (torch's
    own error from a write cut short reads like disk corruption). What the process had set up for
    SIGINT still decides what the held interrupt does: ignored (a job started with nohup or in the
    background) it is dropped, a handler of the program's own is called. Main thread only, as signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(frame))
    if previous is None:  # installed from C, not Python: Python's default is the closest
        previous = signal.default_int_handler
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if not held or previous is signal.SIG_IGN:
        return
    if callable(previous) and previous is not signal.default_int_handler:
        previous(signal.SIGINT, held[0])
        return
    raise KeyboardInterrupt(f"interrupted while writing {path}; the write was completed first")


# --- reading --------------------------------------------------------------------------------------
def load_checkpoint_file(path: str) -> Any:
    """The object in a checkpoint file, read as every checkpoint is
    (``detcore.checkpoint.io.load_checkpoint_object``: judged by type first, then
    ``torch.load(weights_only=True)``), with errors that name the file and say why."""
    return load_checkpoint_object(os.fspath(path))


def load_model_weights(model: nn.Module, path: str, *, strict: bool = False, all_ranks: bool = False) -> LoadReport:
    """Initialize ``model`` (or a DDP wrapper's module) from the weights in ``path``.

    ``path`` is a file, or a model zoo name or URL (downloaded once into the cache and verified:
    detcore.checkpoint.model_zoo.resolve_weights; ``all_ranks`` says every rank of the process
    group calls this together, so rank 0 downloads while the others wait).
    Any checkpoint format detcore.checkpoint recognizes works (detcore, torchvision, detectron2,
    ImageNet ResNets): tensors are renamed for the model, and those whose name and shape fit are
    copied; the rest are listed in the report, whose table is logged (a warning when anything
    did not load). ``strict=True`` raises ``ValueError`` instead of loading partially.
    """
    model = comm.unwrap_model(model)
    path = resolve_weights(path, all_ranks=all_ranks)
    usable, report = load_converted_state_dict(path, model)
    if strict and not report.complete:
        raise ValueError(f"The weights in {path!r} do not match the model:\n{report.table()}")
    model.load_state_dict(usable, strict=False)
    if report.complete:
        logger.info("Loaded all %d model tensors from %s (%s format)", len(report.mapped), path, report.format)
    else:
        logger.warning("%s\n%s", report.summary(), report.table())
    return report


# --- the trainer's checkpointer -------------------------------------------------------------------
class Checkpointer:
    """Saves and restores everything a run needs to continue where it stopped.

    A checkpoint holds "model", "optimizer", "scheduler", "grad_scaler", "trainer" (the ones
    given; "trainer" is ``SimpleTrainer.state_dict()``: the run's seed), "rng_states" (python /
    numpy / torch / CUDA, one entry per rank) and whatever ``save`` gets as keyword arguments (the
    trainer passes ``iteration``). ``save`` must be called on every rank
    (it gathers the RNG states); only rank 0 writes.
    """

    def __init__(
        self,
        model: nn.Module,
        save_dir: str,
        *,
        optimizer: Optional[torch.optim.Optimizer] = None,
        scheduler: Optional[Any] = None,
        grad_scaler: Optional[Any] = None,
        trainer: Optional[Any] = None,
        save_to_disk: Optional[bool] = None,
    ):
        self.model = comm.unwrap_model(model)
        self.save_dir = save_dir
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.grad_scaler = grad_scaler
        self.trainer = trainer
        self.save_to_disk = comm.is_main_process() if save_to_disk is None else save_to_disk
        # What last_checkpoint named before this process' latest save (None: nothing), and that save.
        self._before_last_save: Optional[str] = None
        self._last_saved: Optional[str] = None

    def _pointer_path(self) -> str:
        return os.path.join(self.save_dir, LAST_CHECKPOINT_FILE)

    def save(self, name: str, **extra: Any) -> Optional[str]:
        """Write ``<save_dir>/<name>.pth`` and point ``last_checkpoint`` at it; returns the path
        (None on ranks that do not write)."""
        rng = comm.all_gather(comm.rng_states())
        if not self.save_to_disk:
            return None
        data = {"model": self.model.state_dict()}
        bad = [k for k, v in data["model"].items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
        if bad:
            shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            raise FloatingPointError(
                f"Refusing to write checkpoint {name}: the model has infinite or NaN weights ({shown}); "
                f"the last checkpoint in {self.save_dir} is the last good state"
            )
        for key, obj in self._checkpointables():
            if obj is not None:
                data[key] = obj.state_dict()
        data["rng_states"] = rng
        data.update(extra)
        filename = f"{name}.pth"
        path = os.path.join(self.save_dir, filename)
        previous = self._pointer_text()
        with _ctrl_c_deferred(path):
            try:
                atomic_torch_save(data, path)
                _atomic_write_text(self._pointer_path(), filename)
            except Exception as e:  # a full disk reads "enforce fail at inline_container.cc" in torch
                raise OSError(self._write_failure(path, previous, e)) from e
        self._before_last_save, self._last_saved = previous or None, filename
        self._remove_stale_temp_files()
        logger.info("Saved checkpoint %s", path)
        return path

    def _pointer_text(self) -> Optional[str]:
        try:
            with open(self._pointer_path()) as f:
                return f.read().strip()
        except (OSError, UnicodeDecodeError):
            return None

    def _write_failure(self, path: str, previous: Optional[str], error: Exception) -> str:
        """The sentence for a checkpoint that could not be written: the writes are atomic, so
        the pointer still names the checkpoint it named before, complete."""
        try:
            free = f"{shutil.disk_usage(self.save_dir).free / 2**20:.0f} MiB free there"
        except OSError:
            free = "free space unknown"
        kept = (
            f"{self._pointer_path()} still names {previous}, which is intact"
            if previous
            else "there was no earlier checkpoint, and no partial file is left"
        )
        return f"Could not write checkpoint {path} ({free}; {type(error).__name__}: {error}). Nothing was replaced: {kept}"

    def set_aside_last_save(self) -> Tuple[Optional[str], Optional[str]]:
        """Point ``last_checkpoint`` back to what it named before this process' latest save (or
        remove it when it named nothing): for a checkpoint whose weights turned out to diverge.
        The file itself stays. Returns (the file set aside, what ``last_checkpoint`` names now);
        the first is None on ranks that do not write, or when nothing was saved."""
        if not self.save_to_disk or self._last_saved is None:
            return None, self._pointer_text() or None
        if self._before_last_save is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._pointer_path())
            _fsync_dir(self.save_dir)
        else:
            _atomic_write_text(self._pointer_path(), self._before_last_save)
        set_aside, self._last_saved = self._last_saved, None
        return set_aside, self._before_last_save

    def _checkpointables(self):
        return (
            ("optimizer", self.optimizer), ("scheduler", self.scheduler), ("grad_scaler", self.grad_scaler),
            ("trainer", self.trainer),
        )

    def _remove_stale_temp_files(self) -> None:
        # Left by runs killed mid-save. Only rank 0 of one run writes into save_dir, and its own
        # save has finished, so any temporary file still there belongs to a dead process.
        for tmp in glob.glob(os.path.join(glob.escape(self.save_dir), ".*.tmp")):
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def get_checkpoint_file(self) -> Optional[str]:
        """The checkpoint ``last_checkpoint`` names, or None when there is no ``last_checkpoint``.
        It must name an existing file inside ``save_dir``; anything else is an error that says
        how to go on (a pointer is never followed out of the folder, nor silently ignored)."""
        pointer = self._pointer_path()
        self._refuse_link_out_of_the_folder(pointer, pointer)
        try:
            with open(pointer) as f:
                name = f.read().strip()
        except FileNotFoundError:
            if os.path.islink(pointer):
                raise FileNotFoundError(
                    f"{pointer} is a symbolic link to {os.path.realpath(pointer)}, which does not exist; "
                    "restore it, or remove the link to start from scratch"
                ) from None
            return None
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read {pointer}: {e}") from e
        if not name or name in (".", "..") or os.path.basename(name) != name or "\x00" in name:
            raise ValueError(
                f"{pointer} must hold the file name of a checkpoint in {self.save_dir}, got {name!r}; "
                "write the name of one of its model_*.pth files into it, or remove it to start from scratch"
            )
        path = os.path.join(self.save_dir, name)
        self._refuse_link_out_of_the_folder(path, pointer)
        if not os.path.isfile(path):
            present = sorted(f for f in os.listdir(self.save_dir) if f.endswith(".pth"))
            raise FileNotFoundError(
                f"{pointer} names {name!r}, which does not exist in {self.save_dir} (checkpoints there: "
                f"{present or 'none'}). To resume, restore it or write the name of another checkpoint into "
                f"{LAST_CHECKPOINT_FILE}; to start from scratch, remove {pointer}"
            )
        return path

    def _refuse_link_out_of_the_folder(self, link: str, pointer: str) -> None:
        # A symbolic link (the pointer, or the file it names) into another run's folder would
        # resume that run's state as if it were this one's.
        folder, target = os.path.realpath(self.save_dir), os.path.realpath(link)
        if os.path.islink(link) and os.path.commonpath([folder, target]) != folder:
            weights = "" if link == pointer else f"; to start from its weights, MODEL.WEIGHTS {target} without --resume"
            raise ValueError(
                f"{link} is a symbolic link to {target}, outside {self.save_dir}: --resume follows "
                f"{LAST_CHECKPOINT_FILE} only to a file inside OUTPUT_DIR. To continue that run, give its folder as "
                f"OUTPUT_DIR{weights}; or remove {pointer} to start from scratch"
            )

    def has_checkpoint(self) -> bool:
        return self.get_checkpoint_file() is not None

    def resume(self, path: Optional[str] = None) -> Dict[str, Any]:
        """Restore model, optimizer, scheduler, grad scaler, trainer and RNG states from ``path``
        (default: the last checkpoint). Returns the other entries (e.g. ``iteration``).

        The optimizer and the LR schedule keep the settings they were built with (this run's
        config: LR, steps, warmup, momentum, weight decay) and take their state and position from
        the checkpoint (``detcore.solver.resume``); settings that differ from the checkpoint's are
        logged in a warning.

        The model must match the checkpoint exactly: resuming a different model is an error.
        """
        path = path or self.get_checkpoint_file()
        if path is None:
            raise FileNotFoundError(f"No checkpoint to resume from in {self.save_dir!r} (no {LAST_CHECKPOINT_FILE})")
        data = load_checkpoint_file(path)
        if not isinstance(data, dict) or "model" not in data:
            raise ValueError(f"{path!r} is not a training checkpoint (no 'model' entry); use MODEL.WEIGHTS for weights")
        usable, report = convert_state_dict(data.pop("model"), self.model, format="detcore", source=path)
        if not report.complete:
            raise ValueError(f"Cannot resume from {path!r}: it does not match the model.\n{report.table()}")
        self.model.load_state_dict(usable)
        changed = []
        for key, obj in self._checkpointables():
            state = data.pop(key, None)
            if obj is None:
                continue
            if state is None:
                logger.warning("%s has no '%s' state; it starts fresh", path, key)
            elif key == "grad_scaler" and not state:
                continue  # saved from a run without a scaler
            elif key == "optimizer":
                changed += [f"optimizer {c}" for c in load_optimizer_state(obj, state)]
            elif key == "scheduler":
                changed += [f"LR schedule {c}" for c in load_scheduler_state(obj, state)]
            else:
                obj.load_state_dict(state)
        if changed:
            lrs = sorted({g["lr"] for g in self.optimizer.param_groups}) if self.optimizer is not None else []
            logger.warning(
                "Resuming %s with other solver settings than it was saved with; this run's config applies from the "
                "resumed iteration on (LR now %s):\n  %s", path, ", ".join(f"{lr:.6g}" for lr in lrs), "\n  ".join(changed),
            )
        self._restore_rng(data.pop("rng_states", None), path)
        logger.info("Resumed from %s", path)
        return data

    def _restore_rng(self, states: Optional[list], path: str) -> None:
        if not states:
            logger.warning("%s has no RNG states; random streams are not restored", path)
            return
        if len(states) != comm.get_world_size():
            logger.warning(
                "%s was saved by %d process(es), this run has %d: random streams are not restored",
                path, len(states), comm.get_world_size(),
            )
            return
        comm.set_rng_states(states[comm.get_rank()])

    def resume_or_load(self, weights: str, resume: bool = True) -> Dict[str, Any]:
        """With ``resume`` and a last checkpoint: ``resume()`` it. Otherwise load ``weights``
        (when not empty) as model weights only. Returns the checkpoint's extra entries ({} for
        weights)."""
        if resume and self.has_checkpoint():
            return self.resume()
        if resume:
            logger.info("No checkpoint found in %s; starting from scratch", self.save_dir)
        if weights:
            load_model_weights(self.model, weights, all_ranks=True)  # every rank resumes or loads
        return {}
