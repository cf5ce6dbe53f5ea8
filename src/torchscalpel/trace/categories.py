"""One categoriser for ops and kernels, used by every trace analysis, ``profile`` and the report.

Two vocabularies:

- :func:`categorize` gives the human category of a CPU op or GPU kernel (one of
  :data:`CATEGORIES`: ``matmul``, ``conv``, ``attention``, ``embedding``, ``elementwise``,
  ``reduction``, ``norm``, ``copy``, ``communication``, ``optimizer``, ``autograd`` (engine
  wrappers such as ``AddmmBackward0``), ``memory``, ``other``).
- :func:`kernel_type` gives HolisticTraceAnalysis's kernel type (``COMPUTATION``,
  ``COMMUNICATION``, ``MEMORY``, ``OTHER``), matched on the kernel name with HTA's own
  expressions so the temporal and kernel breakdowns agree with HTA's figures.
"""

from __future__ import annotations

import re
from functools import lru_cache

CATEGORIES: tuple[str, ...] = (
    "matmul",
    "conv",
    "attention",
    "embedding",
    "elementwise",
    "reduction",
    "norm",
    "copy",
    "communication",
    "optimizer",
    "autograd",
    "memory",
    "other",
)

# Ordered: the first pattern that matches wins (e.g. "nccl" before "copy" for nccl memcpy kernels).
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (cat, re.compile(rx, re.IGNORECASE))
    for cat, rx in (
        (
            "communication",
            r"nccl|rccl|c10d::|gloo|all_?reduce|all_?gather|reduce_?scatter|broadcast_|alltoall|"
            r"send_?recv|barrier|record_param_comms|all_?to_?all|all2all",
        ),
        ("optimizer", r"optimizer|multi_tensor_apply|_foreach_|adam|sgd|lamb_|fused_adam|Optimizer\.step"),
        # autograd engine wrappers (their own self time is bookkeeping; the real work is in child ops).
        # Engine nodes end in a digit (AddmmBackward0); aten's own backward kernels
        # (aten::convolution_backward) fall through to their real category below.
        ("autograd", r"^autograd::|Backward\d+$|AccumulateGrad|autograd::CppNode"),
        ("attention", r"flash|attention|sdpa|fmha|_efficient_attention|scaled_dot_product"),
        ("conv", r"conv|cudnn_convolution|implicit_?gemm|winograd|dgrad|wgrad|fprop|_nchw|nhwc"),
        ("embedding", r"embedding|embedding_bag|\bembs?\b|_embs_|split_lookup|\btbe\b"),
        (
            "matmul",
            r"(?<!fb)gemm|matmul|\bmm\b|aten::mm|aten::bmm|aten::addmm|aten::baddbmm|aten::linear|cublas|cutlass|"
            r"aten::einsum|aten::_scaled_mm|sgemm|hgemm|dot_kernel|Cijk_",
        ),
        ("norm", r"norm|batch_norm|layer_norm|group_norm|rms_?norm|bn_fw|bn_bw|welford"),
        (
            "reduction",
            r"reduce|softmax|sum\b|aten::sum|aten::mean|aten::max\b|aten::min\b|aten::argmax|aten::var|"
            r"aten::std|cross_entropy|nll_loss|log_softmax|aten::norm|cumsum|topk|sort",
        ),
        (
            "copy",
            r"memcpy|copy|aten::to\b|aten::_to_copy|aten::contiguous|aten::clone|cat\b|aten::cat|aten::stack|"
            r"index|gather|scatter|transpose|permute|DtoH|HtoD|DtoD",
        ),
        (
            "memory",
            r"memset|aten::empty|aten::zeros|aten::ones|aten::fill_|aten::zero_|aten::full|aten::resize_|"
            r"\[memory\]|cudaMalloc|cudaFree|hipMalloc|hipFree|empty_strided",
        ),
        (
            "elementwise",
            r"elementwise|vectorized|unrolled_elementwise|aten::(add|sub|mul|div|relu|gelu|silu|sigmoid|"
            r"tanh|exp|log|pow|sqrt|rsqrt|neg|abs|clamp|where|dropout|threshold|masked_fill|"
            r"hardtanh|leaky_relu|lerp|addcmul|addcdiv|sign|floor|ceil|round|eq|ne|lt|gt|le|ge|"
            r"bitwise|logical|maximum|minimum|reciprocal|sin|cos)|triton_poi",
        ),
    )
)


# Characters of a name the rules look at: longer than any real op or (templated C++) kernel name, and a
# bound on the regex work, so a hostile trace with a 32 MB name costs microseconds here, not minutes.
CATEGORIZE_CHARS = 16384


@lru_cache(maxsize=65536)
def categorize(name: str) -> str:
    """The category of an op or kernel name (one of :data:`CATEGORIES`)."""
    name = name[:CATEGORIZE_CHARS]
    for cat, rx in _RULES:
        if rx.search(name):
            return cat
    return "other"


# HolisticTraceAnalysis's expressions (hta/utils/utils.py), kept verbatim, including their precedence.
_HTA_COMM = re.compile(r"^nccl.*Kernel")
_HTA_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_HTA_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


@lru_cache(maxsize=65536)
def kernel_type(name: str) -> str:
    """HTA's kernel type of a GPU activity name: COMMUNICATION, MEMORY, COMPUTATION or OTHER."""
    if _HTA_COMM.match(name):
        return "COMMUNICATION"
    if _HTA_MEMORY.match(name):
        return "MEMORY"
    if not _HTA_NOT_COMPUTE.match(name):
        return "COMPUTATION"
    return "OTHER"
