"""Build the custom-op library with torch.utils.cpp_extension (called by `make`).

Builds the CPU kernel always, and the CUDA kernel too when nvcc is found *and* torch is a CUDA build; says
which it did. The library lands in bert_ipu/ as bert_ipu_ops.so, where bert_ipu.ops loads it.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import torch
from torch.utils import cpp_extension

HERE = Path(__file__).resolve().parent
TARGET = HERE.parent / "bert_ipu" / "bert_ipu_ops.so"
DEFAULT_ARCHS = "8.0;9.0"  # A100, H100/H200: the CUDA kernel's targets when no GPU is visible to read them off


def choose_cuda_targets() -> None:
    """With no GPU visible (a build machine) and no TORCH_CUDA_ARCH_LIST, name the targets: torch reads them off the
    visible GPUs and, with none, fails inside cpp_extension with an IndexError. Ampere and Hopper by default; the
    variable chooses others."""
    if not torch.cuda.is_available() and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_ARCHS
        print(f"no GPU visible: building the CUDA kernel for TORCH_CUDA_ARCH_LIST={DEFAULT_ARCHS} "
              "(set the variable to choose others)")


def main() -> None:
    sources = [HERE / "packed_attention_mask.cpp"]
    nvcc = shutil.which("nvcc") or (Path(cpp_extension.CUDA_HOME or "") / "bin" / "nvcc").is_file()
    with_cuda = bool(nvcc) and torch.version.cuda is not None
    if with_cuda:
        print(f"nvcc found and torch {torch.__version__} is a CUDA build: building CPU and CUDA kernels")
        sources.append(HERE / "packed_attention_mask_cuda.cu")
        choose_cuda_targets()
    elif nvcc:
        print(f"nvcc found but torch {torch.__version__} is a CPU-only build: CPU kernel only")
    else:
        print("no nvcc: CPU kernel only")
    build_dir = HERE.parent / "build" / "custom_ops"
    build_dir.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(
        name="bert_ipu_ops", sources=[str(s) for s in sources], build_directory=str(build_dir),
        extra_cflags=["-O3"], extra_cuda_cflags=["-O3"], with_cuda=with_cuda, is_python_module=False,
        verbose=False,
    )
    built = build_dir / "bert_ipu_ops.so"
    tmp = TARGET.with_suffix(".so.tmp")
    shutil.copyfile(built, tmp)
    os.replace(tmp, TARGET)  # atomic: a half-copied library is never loaded
    print(f"built {TARGET.relative_to(HERE.parent)}")


if __name__ == "__main__":
    sys.exit(main())
