"""bf16 in Triton's interpreter as the GPU computes it, for kernels checked on CPU (tests/interpreted.py's children).

- The interpreter narrows float32 to bf16 by truncation (and its round-to-nearest-even mode mishandles the mantissa
  carry); the GPU rounds to nearest even (cvt.rn.bf16.f32), as torch does.
- Its tl.dot multiplies bf16 operands as their raw 16-bit patterns; the GPU's tensor cores multiply their values
  exactly and accumulate in float32.
"""
from __future__ import annotations


def gpu_like_bf16() -> None:
    """Patch the interpreter (in this process) so bf16 conversions and dots give what the GPU gives."""
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime import interpreter

    convert = interpreter._convert_float

    def _convert(data, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16:
            f32 = torch.from_numpy(np.ascontiguousarray(data).view(np.float32))
            return f32.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        return convert(data, src, dst, rounding_mode)

    dot = interpreter.InterpreterBuilder.create_dot

    def _widen(t):  # bf16 bits are the top half of the float32 of the same value: exact
        if t.dtype.scalar == tl.bfloat16:
            return interpreter.TensorHandle((t.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
        return t

    def _dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return dot(self, _widen(a), _widen(b), d, input_precision, max_num_imprecise_acc)

    interpreter._convert_float = _convert
    interpreter.InterpreterBuilder.create_dot = _dot
