"""One contract for both storage backends: LocalStorage (a directory) and S3Storage (boto3 against
moto's S3 server over HTTP, tests/support/s3.py)."""

from __future__ import annotations

import os
import uuid

import httpx
import pytest
from boto3.s3.transfer import TransferConfig

from core import s3_storage
from core.s3_storage import S3Storage
from core.settings import Settings
from core.storage import LocalStorage, Storage
from core.storage_factory import get_storage


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path) -> Storage:
    if request.param == "local":
        return get_storage(Settings(data_dir=tmp_path))
    bucket = request.getfixturevalue("s3_bucket")
    return get_storage(bucket.settings(tmp_path))


def new_job(storage: Storage) -> str:
    job_id, _ = storage.new_job_dir()
    return job_id


def test_get_storage_picks_the_backend(tmp_path, s3_bucket):
    assert type(get_storage(Settings(data_dir=tmp_path))) is LocalStorage
    elsewhere = get_storage(Settings(data_dir=tmp_path, storage_url=f"file://{tmp_path}/files"))
    assert type(elsewhere) is LocalStorage
    assert elsewhere.paths(str(uuid.uuid4())).root.parent == tmp_path / "files" / "jobs"
    s3 = get_storage(s3_bucket.settings(tmp_path))
    assert isinstance(s3, S3Storage) and (s3.bucket, s3.prefix) == (s3_bucket.bucket, "nf/")
    assert s3.work_dir(str(uuid.uuid4())).root.parent == tmp_path.resolve() / "scratch" / "jobs"
    with pytest.raises(ValueError):
        get_storage(Settings(data_dir=tmp_path, storage_url="ftp://host/x"))


def test_bytes_round_trip_list_exists_delete(storage):
    job = new_job(storage)
    storage.put_bytes(job, "dataset/images/0001.png", b"one")
    storage.put_bytes(job, "dataset/images/0002.png", b"second")
    storage.put_bytes(job, "datasets.txt", b"not under dataset/")
    storage.put_bytes(job, "artifacts/mesh.glb", b"mesh")
    assert storage.get_bytes(job, "dataset/images/0002.png") == b"second"
    listed = storage.list(job, "dataset/")
    assert [(o.key, o.size) for o in listed] == [
        ("dataset/images/0001.png", 3),
        ("dataset/images/0002.png", 6),
    ]
    assert all(o.mtime > 0 for o in listed)
    assert {o.key for o in storage.list(job)} >= {
        "dataset/images/0001.png",
        "datasets.txt",
        "artifacts/mesh.glb",
    }
    assert storage.exists(job, "artifacts/mesh.glb")
    assert not storage.exists(job, "artifacts/other.glb")
    storage.put_bytes(job, "artifacts/mesh.glb", b"replaced")
    assert storage.get_bytes(job, "artifacts/mesh.glb") == b"replaced"
    storage.delete(job, "artifacts/mesh.glb")
    storage.delete(job, "artifacts/mesh.glb")  # absent: no error
    assert not storage.exists(job, "artifacts/mesh.glb")
    assert storage.stored_bytes(job) >= 3 + 6


def test_missing_objects_raise_file_not_found(storage, tmp_path):
    job = new_job(storage)
    with pytest.raises(FileNotFoundError):
        storage.get_bytes(job, "checkpoints/latest")
    with pytest.raises(FileNotFoundError):
        storage.open_read(job, "checkpoints/latest")
    with pytest.raises(FileNotFoundError):
        storage.download(job, "checkpoints/latest", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert storage.list(job, "checkpoints/") == []


@pytest.mark.parametrize("key", ["../escape", "/etc/passwd", "a//b", "a/./b", "", "a\\b"])
def test_keys_stay_inside_the_job(storage, key):
    job = new_job(storage)
    with pytest.raises(ValueError):
        storage.put_bytes(job, key, b"x")
    with pytest.raises(ValueError):
        storage.get_bytes(job, key)


def test_files_round_trip_and_streaming_read(storage, tmp_path):
    job = new_job(storage)
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(70_000))
    storage.put_file(job, "upload/x.zip", src)
    dest = tmp_path / "deep" / "copy.bin"
    storage.download(job, "upload/x.zip", dest)
    assert dest.read_bytes() == src.read_bytes()
    fh = storage.open_read(job, "upload/x.zip")
    try:
        assert fh.read(10) == src.read_bytes()[:10]
        assert fh.read() == src.read_bytes()[10:]
    finally:
        fh.close()


def test_delete_job_removes_every_object_and_only_its_own(storage, monkeypatch):
    monkeypatch.setattr(s3_storage, "DELETE_BATCH", 2)  # several DeleteObjects requests
    job, other = new_job(storage), new_job(storage)
    for i in range(5):
        storage.put_bytes(job, f"checkpoints/step-{i}.json", b"{}")
    storage.put_bytes(other, "artifacts/keep.png", b"png")
    (storage.work_dir(job).root / "scratch.txt").parent.mkdir(parents=True, exist_ok=True)
    storage.delete_job(job)
    assert storage.list(job) == []
    assert not storage.work_dir(job).root.exists()
    assert not storage.paths(job).root.exists()
    assert storage.get_bytes(other, "artifacts/keep.png") == b"png"


def test_push_then_pull_moves_only_missing_or_changed(storage):
    job = new_job(storage)
    work = storage.work_dir(job)
    (work.checkpoints).mkdir(parents=True, exist_ok=True)
    (work.checkpoints / "step-1.json").write_text('{"step": 1}')
    (work.checkpoints / "step-1.safetensors").write_bytes(b"tensors-1")
    (work.artifacts / "sub").mkdir(parents=True)
    (work.artifacts / "sub" / "frame.png").write_bytes(b"frame")
    storage.push(job, "checkpoints")
    storage.push(job, "artifacts/sub/frame.png")
    assert {o.key for o in storage.list(job, "checkpoints/")} == {
        "checkpoints/step-1.json",
        "checkpoints/step-1.safetensors",
    }
    assert storage.get_bytes(job, "artifacts/sub/frame.png") == b"frame"

    storage.evict(job)  # S3: the scratch copy goes; local: the files are the data and stay
    storage.pull(job, "checkpoints/")
    assert (work.checkpoints / "step-1.safetensors").read_bytes() == b"tensors-1"
    assert (work.checkpoints / "step-1.json").read_text() == '{"step": 1}'

    before = (work.checkpoints / "step-1.json").stat().st_mtime_ns
    storage.put_bytes(job, "checkpoints/step-1.safetensors", b"tensors-1 rewritten")
    storage.put_bytes(job, "checkpoints/latest", b"1")
    storage.pull(job, "checkpoints/")
    assert (work.checkpoints / "step-1.safetensors").read_bytes() == b"tensors-1 rewritten"
    assert (work.checkpoints / "latest").read_text() == "1"
    assert (work.checkpoints / "step-1.json").stat().st_mtime_ns == before  # not fetched again

    # Deleted objects leave the copy; a file made locally and not pushed yet stays.
    (work.checkpoints / "step-2.json").write_text("{}")
    storage.delete(job, "checkpoints/step-1.json")
    storage.pull(job, "checkpoints/")
    assert not (work.checkpoints / "step-1.json").exists()
    assert (work.checkpoints / "step-2.json").exists()
    with pytest.raises(FileNotFoundError):
        storage.push(job, "checkpoints/nothing-here")


def test_a_large_file_moves_through_multipart(storage, tmp_path):
    if isinstance(storage, S3Storage):
        # S3's smallest part is 5 MiB: 12 MiB is three parts.
        storage.transfer = TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
    job = new_job(storage)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(12 << 20))
    storage.put_file(job, "dataset/big.bin", big)
    out = tmp_path / "back.bin"
    storage.download(job, "dataset/big.bin", out)
    assert out.read_bytes() == big.read_bytes()
    if isinstance(storage, S3Storage):
        name = f"{storage.prefix}jobs/{job}/dataset/big.bin"
        etag = storage.client.head_object(Bucket=storage.bucket, Key=name)["ETag"]
        assert etag.strip('"').endswith("-3"), etag  # a multipart object's ETag counts its parts


def test_presigned_url_serves_the_bytes_as_a_named_attachment(storage):
    job = new_job(storage)
    storage.put_bytes(job, "artifacts/mesh.glb", b"glTF-bytes")
    url = storage.presigned_url(job, "artifacts/mesh.glb", expires_s=60, filename="mesh.glb")
    if isinstance(storage, LocalStorage):
        assert url is None  # the API streams local files itself
        assert storage.local_path(job, "artifacts/mesh.glb").read_bytes() == b"glTF-bytes"
        return
    assert storage.local_path(job, "artifacts/mesh.glb") is None
    r = httpx.get(url)  # no credentials: the signature is the permission
    assert r.status_code == 200 and r.content == b"glTF-bytes"
    assert 'filename="mesh.glb"' in r.headers["content-disposition"]
    assert r.headers["content-disposition"].startswith("attachment")
    tampered = url.replace("mesh.glb", "other.glb", 1)
    assert httpx.get(tampered).status_code == 403


def test_local_reads_refuse_links_out_of_the_job(tmp_path):
    storage = LocalStorage(tmp_path)
    job = new_job(storage)
    (tmp_path / "secret.txt").write_text("top secret")
    (storage.paths(job).root / "artifacts").mkdir()
    (storage.paths(job).root / "artifacts" / "link.png").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(FileNotFoundError):
        storage.get_bytes(job, "artifacts/link.png")
    assert storage.local_path(job, "artifacts/link.png") is None
    assert storage.list(job, "artifacts/") == []


def test_direct_upload_in_parts_straight_to_the_store(storage, monkeypatch):
    job = new_job(storage)
    if isinstance(storage, LocalStorage):
        with pytest.raises(NotImplementedError):
            storage.start_upload(job, "upload/scan.zip", 100)
        return
    monkeypatch.setattr(s3_storage, "MULTIPART_CHUNK", 5 << 20)
    data = os.urandom(11 << 20)
    up = storage.start_upload(job, "upload/scan.zip", len(data))
    assert up.part_size == 5 << 20 and len(up.part_urls) == 3
    etags = []
    for i, url in enumerate(up.part_urls):
        r = httpx.put(url, content=data[i * up.part_size : (i + 1) * up.part_size])
        assert r.status_code == 200, r.text  # no credentials: the signature is the permission
        etags.append(r.headers["etag"])
    assert not storage.exists(job, "upload/scan.zip")  # nothing visible before it is finished
    assert storage.upload_parts(job, "upload/scan.zip", up.upload_id) == etags
    with pytest.raises(ValueError):
        storage.finish_upload(job, "upload/scan.zip", up.upload_id, etags[::-1])
    info = storage.finish_upload(job, "upload/scan.zip", up.upload_id, etags)
    assert info.size == len(data) and storage.get_bytes(job, "upload/scan.zip") == data

    dropped = storage.start_upload(job, "upload/other.zip", 10)
    assert httpx.put(dropped.part_urls[0], content=b"0123456789").status_code == 200
    storage.abort_upload(job, "upload/other.zip", dropped.upload_id)
    storage.abort_upload(job, "upload/other.zip", dropped.upload_id)  # gone: no error
    # S3 answers 404 NoSuchUpload; moto a 500: either way the part is refused.
    assert httpx.put(dropped.part_urls[0], content=b"0123456789").status_code >= 400
    assert not storage.exists(job, "upload/other.zip")


def test_deleting_a_job_aborts_its_unfinished_uploads(s3_bucket, tmp_path):
    storage = get_storage(s3_bucket.settings(tmp_path))
    job = new_job(storage)
    up = storage.start_upload(job, "upload/scan.zip", 10)
    assert httpx.put(up.part_urls[0], content=b"0123456789").status_code == 200
    open_uploads = s3_bucket.client.list_multipart_uploads(Bucket=s3_bucket.bucket)
    assert len(open_uploads.get("Uploads", [])) == 1
    storage.delete_job(job)
    open_uploads = s3_bucket.client.list_multipart_uploads(Bucket=s3_bucket.bucket)
    assert open_uploads.get("Uploads", []) == []
    with pytest.raises(FileNotFoundError):
        storage.upload_parts(job, "upload/scan.zip", up.upload_id)
