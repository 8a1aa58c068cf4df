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
