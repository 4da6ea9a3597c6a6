import logging
import os

import pytest
import torch

from tests.engine.toy_model import session_cache


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    """Data cache with the tiny shapes splits registered as tiny_shapes_train / tiny_shapes_val
    (tests/engine/toy_model.py), for the engine and tools tests."""
    old = os.environ.get("DETCORE_CACHE")
    yield session_cache(tmp_path_factory)
    if old is None:
        os.environ.pop("DETCORE_CACHE", None)
    else:
        os.environ["DETCORE_CACHE"] = old


@pytest.fixture(scope="module")
def single_thread():
    """One intra-op thread for a module of small-model tests: threads cost more than they give
    on tiny inputs, and oversubscribe a shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def restore_detcore_logger():
    """Undo what a test's setup_logger did to the "detcore" logger (handlers, propagate, level):
    a tool run in-process turns propagation off, which hides later tests' records from caplog."""
    logger = logging.getLogger("detcore")
    state = (list(logger.handlers), logger.propagate, logger.level)
    yield
    for handler in logger.handlers:
        if handler not in state[0]:
            handler.close()
    logger.handlers[:] = state[0]
    logger.propagate, logger.level = state[1], state[2]
