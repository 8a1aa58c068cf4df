#!/usr/bin/env bash
# Prints the `pip install` arguments that bring in the torch build for this host; the Makefile's
# install step runs `pip install $(this)`. A note on the choice goes to stderr.
#
#   TORCH_VERSION    the release (the Makefile pins it)
#   TORCH_BUILD      auto (default) | cpu | cu126 | cu128 | cu130 ... (a PyTorch wheel index name)
#   TORCH_INDEX_URL  an index to take torch from, whatever the build (a site mirror)
#   PIP              the pip that will install (its configuration decides the CPU case)
#
# auto: a CUDA build where `nvidia-smi` answers (the newest of cu130/cu128/cu126 that the
# driver's CUDA version runs), else cpu. cpu, in this order: the `+cpu` release when the
# configured pip sources already carry it (a wheelhouse, CI's mirror); the configured index as it
# is when pip's configuration names one (the operator's mirror), or when the sources cannot be
# listed (offline: pip's own choice, as before); PyTorch's CPU index on Linux, whose plain PyPI
# wheels are CUDA builds (~3 GB with their CUDA libraries); else PyPI's wheel (macOS and Windows
# wheels there are CPU builds).
set -euo pipefail
version=${TORCH_VERSION:?TORCH_VERSION is required}
build=${TORCH_BUILD:-auto}
index=${TORCH_INDEX_URL:-}
pip=${PIP:-pip}
pytorch_index=https://download.pytorch.org/whl

note() { echo "torch: $*" >&2; }

if [ "$build" = auto ]; then
  driver_cuda=$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: *[0-9][0-9.]*' | grep -o '[0-9][0-9.]*$' || true)
  if [ -n "$driver_cuda" ]; then
    major=${driver_cuda%%.*}
    minor=${driver_cuda#*.}
    minor=${minor%%.*}
    if [ "$major" -ge 13 ]; then
      build=cu130
    elif [ "$major" -eq 12 ] && [ "$minor" -ge 8 ]; then
      build=cu128
    else
      build=cu126
    fi
    note "nvidia-smi reports a driver for CUDA $driver_cuda: $build build (TORCH_BUILD=... to choose)"
  else
    build=cpu
    note "no GPU (nvidia-smi absent or sees none): CPU build (TORCH_BUILD=cu130 etc. to choose)"
  fi
fi

case "$build" in
  cpu | cu[0-9]*) ;;
  *)
    echo "TORCH_BUILD must be auto, cpu or a CUDA wheel index name such as cu126, cu128, cu130 (got '$build')" >&2
    exit 2
    ;;
esac

if [ -n "$index" ]; then
  note "from TORCH_INDEX_URL=$index"
  echo "torch==$version --index-url $index"
  exit 0
elif [ "$build" != cpu ]; then
  echo "torch==$version --index-url $pytorch_index/$build"
  exit 0
fi

if listed=$("$pip" index versions torch 2>/dev/null); then
  releases=", $(sed -n 's/^Available versions: //p' <<<"$listed"),"
else
  releases=""  # the sources could not be listed (offline?): pip's own choice, as before
fi
if [[ "$releases" == *", $version+cpu,"* ]]; then
  note "the configured pip sources carry $version+cpu"
  echo "torch==$version+cpu"
elif [ -n "${PIP_INDEX_URL:-}" ] || [[ "$("$pip" config list 2>/dev/null)" == *.index-url=* ]]; then
  note "pip's configured index is used as it is (TORCH_INDEX_URL=$pytorch_index/cpu to take PyTorch's CPU wheels)"
  echo "torch==$version"
elif [ -z "$releases" ]; then
  note "could not list torch's releases from the configured pip sources: installing as pip chooses"
  echo "torch==$version"
elif [ "$(uname -s)" = Linux ]; then
  echo "torch==$version --index-url $pytorch_index/cpu"
else
  echo "torch==$version"
fi
