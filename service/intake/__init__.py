"""Upload validation, one module per job kind. Runs in the API process: no torch."""


class IntakeError(Exception):
    """A client mistake found while validating an upload; becomes an HTTP error with `detail`."""

    def __init__(self, status_code: int, detail: str):
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail
