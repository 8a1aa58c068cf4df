"""Upload validation, one module per job kind. No torch; runs in the limited intake child process
(service/intake/sandbox.py), never in the API's own."""


class IntakeError(Exception):
    """A client mistake found while validating an upload; becomes an HTTP error with `detail`."""

    def __init__(self, status_code: int, detail: str):
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail
