"""Error texts that reach clients (job.error, an export's error) name no server path."""

from __future__ import annotations

from core.storage import without_paths

JOB = "/srv/nf/data/jobs/3f0c1234-1234-4234-8234-123456789abc"


def test_a_jobs_files_are_named_relative_to_its_folder():
    msg = f"[Errno 2] No such file or directory: '{JOB}/dataset/cameras.json'"
    assert without_paths(msg) == "[Errno 2] No such file or directory: 'dataset/cameras.json'"
    assert without_paths(f"no image in {JOB}/dataset") == "no image in dataset"


def test_other_paths_keep_only_their_name_and_the_rest_is_untouched():
    assert without_paths("cannot load /usr/lib/x86_64/libfoo.so: bad") == (
        "cannot load .../libfoo.so: bad"
    )
    text = "see https://example.com/a/b, ratio 3/4, ./rel/path and ~/home/x"
    assert without_paths(text) == text
