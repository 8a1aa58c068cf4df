"""core.scene_normalize.upright_rotation: an SfM world of any orientation stood upright."""

from __future__ import annotations

import math

import numpy as np
from scipy.spatial.transform import Rotation

from core.scene_normalize import upright_rotation
from experiments.capture_scene import arc_poses
from experiments.synthetic_scene import look_at


def rotated(c2ws: np.ndarray, rot: np.ndarray) -> np.ndarray:
    out = c2ws.copy()
    out[:, :3, :3] = rot @ c2ws[:, :3, :3]
    out[:, :3, 3] = c2ws[:, :3, 3] @ rot.T
    return out


def angle_deg(a: np.ndarray, b: np.ndarray) -> float:
    return math.degrees(math.acos(np.clip(a @ b / np.linalg.norm(a) / np.linalg.norm(b), -1, 1)))


def test_an_arc_in_any_frame_lands_in_one_upright_frame():
    """The phone capture's arc (z up, looking down at the table): from any rotated copy of its
    world, the rotation found brings it back to the same frame, with up within a few degrees of
    the true one, where the cameras' mean up leans towards the table."""
    c2ws = np.array(arc_poses(50))
    mean_up = c2ws[:, :3, 1].mean(0)
    assert angle_deg(mean_up, np.array([0, 0, 1.0])) > 12
    reference = upright_rotation(c2ws)
    assert angle_deg(reference[2], np.array([0, 0, 1.0])) < 5
    for seed in range(5):
        q = Rotation.random(random_state=seed).as_matrix()
        found = upright_rotation(rotated(c2ws, q))
        np.testing.assert_allclose(found @ q, reference, atol=1e-6)
        assert abs(np.linalg.det(found) - 1) < 1e-9
    # the cameras look towards +y in the upright frame
    assert (-(c2ws[:, :3, 2] @ reference.T)).mean(0)[1] > 0


def test_cameras_along_a_line_keep_their_mean_up():
    """Forward-facing cameras walked along a line span no plane: up is their mean up vector."""
    up = np.array([0.0, 0.0, 1.0])
    c2ws = np.array(
        [
            look_at(np.array([x, -3.0, 0.2 * math.sin(x)]), np.array([x, 0.0, 0.0]))
            for x in np.linspace(-1, 1, 12)
        ]
    )
    q = Rotation.random(random_state=7).as_matrix()
    found = upright_rotation(rotated(c2ws, q))
    assert angle_deg(found[2], q @ up) < 1e-6 + angle_deg(c2ws[:, :3, 1].mean(0), up)
    assert angle_deg(found[0], q @ np.array([1.0, 0, 0])) < 2
