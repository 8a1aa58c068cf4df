"""Python client and `nf` command line of the neural-field service (HTTP only, httpx).

    from nf_client import Client
    with Client() as nf:                    # $NF_URL / $NF_API_KEY, else 127.0.0.1:8000
        job = nf.submit("photos.zip", kind="splat")
        job = nf.wait(job["id"])
        nf.export_file(job["id"], "spz", "scene.spz")

The methods are in nf_client/client.py, the wire types in nf_client/types.py.
"""

from nf_client.client import ApiError, Client, NfError, Unreachable, look_at_pose
from nf_client.types import (
    TERMINAL,
    Artifact,
    Event,
    Export,
    Job,
    JobList,
    Orbit,
    PathJob,
    Pose,
    Progress,
    Rendered,
    Upload,
)

__version__ = "0.1.0"

__all__ = [
    "TERMINAL",
    "ApiError",
    "Artifact",
    "Client",
    "Event",
    "Export",
    "Job",
    "JobList",
    "NfError",
    "Orbit",
    "PathJob",
    "Pose",
    "Progress",
    "Rendered",
    "Unreachable",
    "Upload",
    "look_at_pose",
]
