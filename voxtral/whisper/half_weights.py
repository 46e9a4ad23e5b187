"""Linear layers with float16 weights and float32 products, each row computed on its own.

A batch of sessions is decoded together, so a linear layer must give a row the same values
whatever rows sit beside it: a session's words must not depend on its neighbours'. torch's
dynamic int8 linear quantizes a batch's activations with one scale (the loudest row sets
every row's); fbgemm's float16-weight kernel quantizes nothing at run time and sums each row
in the same order whatever the batch's size, bit for bit (`tests/test_whisper_decoding.py`),
given the rows its AVX2 kernels need (`ROWS_PER_CALL`). It is also the fastest of them on a CPU
for a few rows: the vocabulary projection of one token takes a third of the time the same
product does with int8 weights and int8 activations per token (`torch._int_mm`), and no more
than float32's.

The kernel is called through torch's ATen op, whose packed weight is a tensor: the same kernel
through `torch.ops.quantized`, whose packed weight is a TorchScript object, costs 20-40 µs more
a call to dispatch from Python, and a token's pass makes 32 of these calls.
"""

import warnings

import torch
from torch import nn

# torch marks the ATen op deprecated (for torchao, which is not a dependency); torch is pinned,
# and the tests hold its products to float32 products of the rounded weights.
warnings.filterwarnings("ignore", message="fbgemm_(pack_gemm_matrix|linear)_fp16.* is deprecated")

# fbgemm splits a call's rows among kernels of 1 to 6 rows. On AVX2 the kernels of one and two
# rows sum in another order than those of three to six, so a row's values would depend on how
# many rows came with it; a multiple of three rows never reaches them. AVX-512's all agree.
ROWS_PER_CALL = 3 if torch.backends.cpu.get_cpu_capability() == "AVX2" else 1


def available() -> bool:
    """fbgemm (x86 CPUs) has the kernel; ARM builds of torch do not."""
    return "fbgemm" in torch.backends.quantized.supported_engines


class HalfWeightLinear(nn.Module):
    """`linear`'s weights rounded to float16, its products in float32."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.packed = torch.fbgemm_pack_gemm_matrix_fp16(linear.weight.detach().float())
        self.bias = None if linear.bias is None else linear.bias.detach().float()
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        count = rows.shape[0]
        if count % ROWS_PER_CALL:  # padded with zero rows, a copy that only AVX2's kernels need
            rows = nn.functional.pad(rows, (0, 0, 0, -count % ROWS_PER_CALL))
        out = torch.fbgemm_linear_fp16_weight_fp32_activation(rows, self.packed, self.bias)[:count]
        return out.view(*x.shape[:-1], self.out_features)


def half_weights(module: nn.Module) -> nn.Module:
    """Every float32 `nn.Linear` in `module` (or `module` itself) made a `HalfWeightLinear`, in
    place; those given another dtype keep it."""
    if isinstance(module, nn.Linear) and module.weight.dtype == torch.float32:
        return HalfWeightLinear(module)
    for name, child in module.named_children():
        setattr(module, name, half_weights(child))
    return module
