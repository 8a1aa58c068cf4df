"""Infrastructure shared by the API process and the workers: settings, job storage, the job store
and the Celery wiring. Imports neither torch nor FastAPI, so both processes can depend on it."""
