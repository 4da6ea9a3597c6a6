"""benchmarks/benchmark_worker.py, the benchmarks' one worker protocol: the ready line, replies in
order, a handler's exception as an error naming the worker (with its stderr), prints that never
reach the protocol, several workers at once, and a worker that dies."""
import os
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import benchmark_worker  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="dies with its parent through prctl (Linux)")


@pytest.fixture
def script(tmp_path):
    """A benchmark script in the protocol's shape: `--worker` serves a handler."""
    path = tmp_path / "echo_benchmark.py"
    path.write_text(textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {REPO!r})
        sys.path.insert(1, {os.path.join(REPO, "benchmarks")!r})
        import benchmark_worker

        def handle(request):
            print("a stray print that must not reach the protocol")
            os.write(1, b"and one written to file descriptor 1 directly\\n")
            if request.get("fail"):
                print("the failing request's own message", file=sys.stderr)
                raise ValueError("asked to fail")
            if request.get("exit"):
                sys.stderr.flush()
                os._exit(3)
            return {{"doubled": 2 * request["x"], "argv": sys.argv[1:]}}

        assert sys.argv[1] == "--worker"
        benchmark_worker.serve(handle)
    """))
    return str(path)


def test_requests_are_answered_in_order_past_stray_prints(script):
    worker = benchmark_worker.Worker(script, ["--size", "3"], what="echo worker")
    try:
        assert worker.detcore_path == os.path.join(REPO, "detcore")
        assert worker.call({"x": 1}) == {"doubled": 2, "argv": ["--worker", "--size", "3"]}
        worker.send({"x": 5})
        worker.send({"x": 7})
        assert [worker.receive()["doubled"], worker.receive()["doubled"]] == [10, 14]
    finally:
        worker.close()


def test_a_failing_request_names_the_worker_and_quotes_its_stderr(script):
    worker = benchmark_worker.Worker(script, [], what="echo worker")
    try:
        with pytest.raises(benchmark_worker.WorkerError) as caught:
            worker.call({"fail": True})
        assert caught.value.reason == "echo worker: ValueError: asked to fail"
        assert "the failing request's own message" in str(caught.value)
        assert worker.call({"x": 2})["doubled"] == 4  # the worker lives on
    finally:
        worker.close()


def test_a_dying_worker_is_an_error_with_its_exit_code(script):
    worker = benchmark_worker.Worker(script, [], what="echo worker")
    try:
        with pytest.raises(benchmark_worker.WorkerError, match=r"echo worker exited \(code 3\)"):
            worker.call({"exit": True})
    finally:
        worker.close()


def test_several_workers_at_once(script):
    workers = [benchmark_worker.Worker(script, [], what=f"worker {i}") for i in range(3)]
    try:
        for i, worker in enumerate(workers):
            worker.send({"x": i})
        assert [w.receive()["doubled"] for w in workers] == [0, 2, 4]
    finally:
        for worker in workers:
            worker.close()


def test_digest_tells_bits_apart():
    import torch

    a = torch.tensor([1.0, 2.0])
    assert benchmark_worker.digest(a) == benchmark_worker.digest(a.clone())
    assert benchmark_worker.digest(a) != benchmark_worker.digest(torch.tensor([1.0, 2.0 + 2**-20]))
    assert benchmark_worker.digest(a) != benchmark_worker.digest(a.double())
    assert benchmark_worker.digest((a, a)) != benchmark_worker.digest(a)
