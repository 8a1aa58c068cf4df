"""Checkpoints: atomic files, `latest` pointer, pruning, and fallback past corrupt files."""

from __future__ import annotations

import torch

from worker.checkpoints import CheckpointManager


def _tensors(v: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((3, 4), v), "b": torch.arange(4, dtype=torch.float32) + v}


def test_save_load_latest_and_prune(tmp_path):
    mgr = CheckpointManager(tmp_path / "ck", keep=2)
    assert mgr.load_latest() is None
    for step in (10, 20, 30):
        mgr.save(step, _tensors(step), {"note": f"s{step}"})
    assert mgr.steps() == [30, 20]
    assert (tmp_path / "ck" / "latest").read_text() == "30"
    ck = mgr.load_latest()
    assert ck.step == 30 and ck.meta == {"step": 30, "note": "s30"}
    assert torch.equal(ck.tensors["w"], _tensors(30)["w"])
    assert not list((tmp_path / "ck").glob("*.tmp")) and not list((tmp_path / "ck").glob(".*"))


def test_corrupt_latest_falls_back_to_previous(tmp_path):
    mgr = CheckpointManager(tmp_path / "ck", keep=3)
    mgr.save(1, _tensors(1.0))
    mgr.save(2, _tensors(2.0))
    newest = tmp_path / "ck" / "step-2.safetensors"
    newest.write_bytes(newest.read_bytes()[:50])  # torn write / disk trouble
    ck = mgr.load_latest()
    assert ck.step == 1 and torch.equal(ck.tensors["b"], _tensors(1.0)["b"])

    (tmp_path / "ck" / "step-1.json").write_text("{not json")
    assert mgr.load_latest() is None


def test_missing_pointer_uses_newest_file(tmp_path):
    mgr = CheckpointManager(tmp_path / "ck", keep=3)
    mgr.save(5, _tensors(5.0))
    mgr.save(7, _tensors(7.0))
    (tmp_path / "ck" / "latest").unlink()
    assert mgr.load_latest().step == 7
    assert mgr.latest_step() == 7
