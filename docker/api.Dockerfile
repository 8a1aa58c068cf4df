# API image: FastAPI + Celery client only. No torch, no CUDA: the API never imports worker code,
# so this stays ~200 MB and starts in a second.
ARG PYTHON_IMAGE=python:3.12-slim-bookworm
FROM ${PYTHON_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Same uid as the worker image, so both can write the shared data volume.
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin app \
 && mkdir -p /data && chown app:app /data

WORKDIR /app

# Dependencies first, against empty package stubs, so a code change does not reinstall them.
# Editable: the image runs the copied source tree, so package data (static files) needs no
# packaging rules to be found.
COPY pyproject.toml ./
RUN mkdir -p api_schemas core service && touch api_schemas/__init__.py core/__init__.py service/__init__.py \
 && pip install -e .

COPY api_schemas ./api_schemas
COPY core ./core
COPY service ./service
COPY docker/bin/ /usr/local/bin/

USER app
ENV DATA_DIR=/data
EXPOSE 8000
CMD ["uvicorn", "service.app:app", "--host", "0.0.0.0", "--port", "8000"]
