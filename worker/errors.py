"""Errors that cross from the scene and kind modules to the task layer."""

from __future__ import annotations


class RenderError(Exception):
    """A render request the job cannot serve; becomes an HTTP error with `detail`."""

    def __init__(self, status_code: int, detail: str):
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail
