"""Posed-photo intake shared by `kind=nerf` and `kind=splat`: an archive -> the normal form.

`formats` reads the pose files (Blender, instant-ngp / nerfstudio, COLMAP text or binary),
`images` checks the photos from their headers, `colmap` reads COLMAP models with pycolmap in a
child process, `build` runs the upload skeleton and hands the frames to `core.scene_build`,
which normalises and writes them.
"""
