# Worker image, in two stages:
# - `build`: a CUDA *devel* base (nvcc, so the kernels' .cu launchers compile), g++, ninja and
#   Python's headers, a CUDA build of torch, the project's worker extras, and the kernels'
#   extensions compiled into KERNELS_BUILD_DIR;
# - `runtime` (the image compose runs): a CUDA *runtime* base with no nvcc, compiler or headers,
#   the same virtual environment and the built kernels copied from `build`. kernels/_ext.py loads
#   a finished build as it is (complete.json beside each library: the torch build and the
#   architectures), so no container ever compiles.
# Variants, by build argument:
# - CUDA 13.0 torch, for NVIDIA drivers 580 and newer (the defaults);
# - CUDA 12.8 torch, for drivers 570 to 579: BASE_IMAGE=nvidia/cuda:12.8.1-devel-ubuntu24.04,
#   RUNTIME_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04,
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 (docker/compose.cu128.yml sets them);
# - CPU (docker-compose.cpu.yml): ubuntu:24.04 for both stages and the CPU torch wheel.
# Both stages' bases must be the same Ubuntu release: the venv's python is the system python3.
ARG BASE_IMAGE=nvidia/cuda:13.0.1-devel-ubuntu24.04
ARG RUNTIME_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04
# No GPU is visible during `docker build`, so the architectures to compile for are named here
# (Ampere, Ada, Hopper, Blackwell; +PTX lets newer GPUs JIT from PTX). Both stages see it: the
# CUDA library's complete.json records it and the runtime checks it.
ARG TORCH_CUDA_ARCH_LIST="8.0;8.6;8.9;9.0;10.0;12.0+PTX"

FROM ${BASE_IMAGE} AS build

# The torch wheel's CUDA major version must match the base image's nvcc, or
# torch.utils.cpp_extension refuses to build the CUDA extension.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
ARG TORCH_CUDA_ARCH_LIST
# --require-cuda: a torch wheel without CUDA (a wrong index URL) fails the build instead of
# quietly shipping a CPU-only worker. The CPU variant passes "".
ARG KERNELS_BUILD_ARGS="--require-cuda"

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST} \
    KERNELS_BUILD_DIR=/opt/kernels-build

# g++ and ninja for torch.utils.cpp_extension; python3-dev for Python.h.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 python3-venv python3-dev g++ ninja-build ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv

RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"

RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin app \
 && mkdir -p /opt/kernels-build && chown app:app /opt/kernels-build

WORKDIR /app

# Dependencies first, against empty package stubs, so a code change does not reinstall them.
# torch is already there, so `.[worker]` keeps the build chosen above. Editable: the runtime
# stage puts the sources at the same paths.
COPY pyproject.toml ./
RUN mkdir -p api_schemas core worker kernels \
 && touch api_schemas/__init__.py core/__init__.py worker/__init__.py kernels/__init__.py \
 && pip install -e '.[worker]'

COPY api_schemas ./api_schemas
COPY core ./core
COPY worker ./worker
COPY kernels ./kernels

# Compile the extensions now, as the runtime user, into KERNELS_BUILD_DIR (no GPU is needed to
# compile, only nvcc and TORCH_CUDA_ARCH_LIST). Their module names hash the sources, so a build
# always matches the code beside it.
USER app
RUN python -m kernels.build ${KERNELS_BUILD_ARGS}


FROM ${RUNTIME_IMAGE} AS runtime

ARG TORCH_CUDA_ARCH_LIST

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST} \
    KERNELS_BUILD_DIR=/opt/kernels-build \
    GPU_SLOT_DIR=/run/gpu-slots \
    DATA_DIR=/data

# The interpreter the venv was made with, and libgomp for the CPU libraries (-fopenmp); no
# compiler, no headers, no nvcc.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 libgomp1 ca-certificates \
 && rm -rf /var/lib/apt/lists/*

RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin app \
 && mkdir -p /data /run/gpu-slots \
 && chown app:app /data /run/gpu-slots

COPY --from=build /opt/venv /opt/venv
COPY --from=build --chown=app:app /opt/kernels-build /opt/kernels-build

WORKDIR /app

COPY pyproject.toml ./
COPY api_schemas ./api_schemas
COPY core ./core
COPY worker ./worker
COPY kernels ./kernels
COPY docker/bin/ /usr/local/bin/

# Every library the build stage made is complete for this stage's torch and architectures, and
# the CPU ones load here, without the build tools (the CUDA ones need a GPU to be exercised).
USER app
RUN python -c "import torch; from kernels import _ext; \
devices = ['cpu'] + (['cuda'] if torch.version.cuda else []); \
missing = [f'{e.name} {d}' for e in _ext.EXTENSIONS for d in devices if _ext.complete_build(e, d) is None]; \
assert not missing, f'not built at image build: {missing}'; \
[_ext.load(e, 'cpu') for e in _ext.EXTENSIONS]"

CMD ["celery", "-A", "worker.app", "worker", "-Q", "train", "-c", "1", "--prefetch-multiplier=1"]
