"""Structure from motion for uploads without poses (a folder of photos or a video): frames from
the video (`video`), pycolmap's feature extraction, matching and incremental mapping (`colmap`),
the camera model (`camera`), and the preprocessing stage that turns the result into the
normal-form dataset before training (`stage`)."""
