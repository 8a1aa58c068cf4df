# Worker image: CUDA *devel* base (nvcc, so the kernels' .cu launchers compile), a CUDA build
# of torch, the project's worker extras, and the kernels' extensions built at image build time.
# The CPU variant (docker-compose.cpu.yml) builds the same file with a plain Ubuntu base and
# the CPU torch wheel; nothing else differs.
ARG BASE_IMAGE=nvidia/cuda:13.0.1-devel-ubuntu24.04
FROM ${BASE_IMAGE}

# The torch wheel's CUDA major version must match the base image's nvcc, or
# torch.utils.cpp_extension refuses to build the CUDA extension.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
# No GPU is visible during `docker build`, so the architectures to compile for are named here
# (Ampere, Ada, Hopper, Blackwell; +PTX lets newer GPUs JIT from PTX).
ARG TORCH_CUDA_ARCH_LIST="8.0;8.6;8.9;9.0;10.0;12.0+PTX"
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
    KERNELS_BUILD_DIR=/opt/kernels-build \
    GPU_SLOT_DIR=/run/gpu-slots \
    DATA_DIR=/data

# g++ and ninja for torch.utils.cpp_extension; python3-dev for Python.h.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 python3-venv python3-dev g++ ninja-build ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv

RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"

RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin app \
 && mkdir -p /data /opt/kernels-build /run/gpu-slots \
 && chown app:app /data /opt/kernels-build /run/gpu-slots

WORKDIR /app

# Dependencies first, against empty package stubs, so a code change does not reinstall them.
# torch is already there, so `.[worker]` keeps the build chosen above.
COPY pyproject.toml ./
RUN mkdir -p api_schemas core worker kernels \
 && touch api_schemas/__init__.py core/__init__.py worker/__init__.py kernels/__init__.py \
 && pip install -e '.[worker]'

COPY api_schemas ./api_schemas
COPY core ./core
COPY worker ./worker
COPY kernels ./kernels
COPY docker/bin/ /usr/local/bin/

# Compile the extensions now, as the runtime user, into KERNELS_BUILD_DIR (no GPU is needed to
# compile, only nvcc and TORCH_CUDA_ARCH_LIST). Every container of this image starts with them
# built; their module names hash the sources, so a build always matches the code beside it.
USER app
RUN python -m kernels.build ${KERNELS_BUILD_ARGS}

CMD ["celery", "-A", "worker.app", "worker", "-Q", "train", "-c", "1", "--prefetch-multiplier=1"]
