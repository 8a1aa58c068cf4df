import os

import pytest
import torch


@pytest.fixture(autouse=True)
def _restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def cpu_ext():
    # A broken build must fail the tests, not skip them.
    from kernels import _ext

    return _ext.load_cpu()


@pytest.fixture(scope="session")
def splat_cpu_ext():
    from kernels import _ext

    return _ext.load(_ext.SPLAT, "cpu")


@pytest.fixture(autouse=True)
def _side_stream():
    # KERNELS_TEST_STREAM=side (scripts/gpu_check.sh) issues every op of a test on a fresh side
    # stream: a kernel launched on the wrong stream then races with the ops that fed it.
    if os.environ.get("KERNELS_TEST_STREAM") != "side" or not torch.cuda.is_available():
        yield
        return
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        yield
    stream.synchronize()
