"""kind=nerf uploads over real HTTP through the real app (API process only: intake happens before
anything is enqueued, so no worker is needed to see a dataset accepted or refused)."""

from __future__ import annotations

import io
import json
import zipfile

import pytest

from experiments.synthetic_scene import scene_files


def zipped(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    from tests.support.stack import stack_maker

    with stack_maker(tmp_path_factory) as make:
        yield make(queues=None)


@pytest.fixture(scope="module")
def scene():
    return scene_files(size=24, n_train=10, n_test=3, seed=5)


def test_upload_is_validated_into_the_normal_form(api, scene):
    r = api.submit(zipped(scene), "scene.zip", kind="nerf", config={"steps": 50})
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["kind"] == "nerf" and job["status"] == "queued" and job["config"]["steps"] == 50
    cams = json.loads((api.job_dir(job["id"]) / "dataset" / "cameras.json").read_text())
    assert [f["split"] for f in cams["frames"]].count("test") == 3
    assert all((api.job_dir(job["id"]) / "dataset" / f["file"]).is_file() for f in cams["frames"])
    assert not (api.job_dir(job["id"]) / "upload").exists()


@pytest.mark.parametrize(
    "case, status, words",
    [
        ("slip", 400, "outside"),
        ("missing", 422, "missing"),
        ("bad_config", 422, "steps"),
        ("not_archive", 415, "not a .zip"),
    ],
)
def test_bad_uploads_are_refused_and_leave_nothing(api, scene, case, status, words):
    before = api.job_dirs()
    config = None
    if case == "slip":
        data = zipped({**scene, "../../escape.txt": b"x"})
    elif case == "missing":
        data = zipped({k: v for k, v in scene.items() if k != "train/r_1.png"})
    elif case == "bad_config":
        data, config = zipped(scene), {"steps": -1}
    else:
        data = scene["train/r_0.png"]
    r = api.submit(data, "scene.zip", kind="nerf", config=config)
    assert r.status_code == status, r.text
    assert words in r.json()["detail"]
    assert api.job_dirs() == before
    assert not list(api.data_dir.parent.rglob("escape.txt"))
