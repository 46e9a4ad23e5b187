"""int8 linear layers whose every token is quantized on its own.

torch's dynamic int8 linear quantizes its input with one scale for the whole tensor: in a
batch of sessions, the loudest row sets the scale of every other, and a session's words
changed with the sessions decoded beside it (tests/test_whisper_decoding.py). Here each
token (row) gets its own scale, the product is exact in int32, and a row's output depends
on that row alone.
"""

import torch
from torch import nn


class TokenwiseInt8Linear(nn.Module):
    """`linear` with int8 weights per output channel and int8 activations per token."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127
        self.register_buffer("weight_t", torch.round(weight / scale[:, None]).to(torch.int8).t().contiguous())
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        scale = rows.abs().amax(dim=1, keepdim=True).div_(127).clamp_(min=1e-12)
        quantized = rows.div(scale).round_().to(torch.int8)
        out = torch._int_mm(quantized, self.weight_t).float().mul_(scale).mul_(self.weight_scale)
        if self.bias is not None:
            out.add_(self.bias)
        return out.view(*x.shape[:-1], self.out_features)


def quantize_tokenwise(module: nn.Module) -> nn.Module:
    """Every `nn.Linear` in `module` (or `module` itself) made a `TokenwiseInt8Linear`, in place."""
    if isinstance(module, nn.Linear):
        return TokenwiseInt8Linear(module)
    for name, child in module.named_children():
        setattr(module, name, quantize_tokenwise(child))
    return module
