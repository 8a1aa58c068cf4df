"""`make run` (service/embedded.py) on a CPU host trains scenes at the CPU long side unless told."""

from __future__ import annotations

import pytest

from core.settings import get_settings
from service import embedded


@pytest.fixture
def env(monkeypatch):
    for name in ("TRAIN_LONG_SIDE", "DEVICE"):
        # set, then removed: teardown removes what the code under test writes to os.environ
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


def test_cpu_host_gets_the_cpu_long_side(env):
    # The probe asks this venv's torch, as the embedded worker would: this machine has no GPU.
    if embedded.worker_device_type() != "cpu":
        pytest.skip("this host's torch sees a GPU")
    assert get_settings().train_long_side == 800
    assert embedded.use_cpu_defaults_if_cpu() is True
    assert get_settings().train_long_side == embedded.CPU_TRAIN_LONG_SIDE == 400


def test_device_cpu_gets_the_cpu_long_side(env):
    env.setenv("DEVICE", "cpu")
    assert embedded.use_cpu_defaults_if_cpu() is True
    assert get_settings().train_long_side == 400


@pytest.mark.parametrize("setting", [{"TRAIN_LONG_SIDE": "640"}, {"DEVICE": "cuda:0"}])
def test_a_set_long_side_or_a_gpu_worker_keeps_its_value(env, setting):
    for k, v in setting.items():
        env.setenv(k, v)
    assert embedded.use_cpu_defaults_if_cpu() is False
    assert get_settings().train_long_side == int(setting.get("TRAIN_LONG_SIDE", 800))
