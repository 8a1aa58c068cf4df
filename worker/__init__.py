import os

if os.environ.get("NF_FAKE_CUDA", "") not in ("", "0"):  # test-only: see worker/fake_cuda.py
    from worker import fake_cuda

    fake_cuda.enable_from_env()
