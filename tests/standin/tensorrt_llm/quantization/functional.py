"""The load-time weight-only quantizer: tensorrt_llm/models/convert_utils.py ``weight_only_quantize_dict``
over ``torch.ops.trtllm.symmetric_quantize_last_axis_of_batched_matrix``
(cpp/tensorrt_llm/kernels/cutlass_kernels/cutlass_preprocessors.cpp ``symmetric_quantize``).

Written independently of trtllm_medusa_ports/quant from the upstream source: the weight is transposed to
``[in, out]``; per column ``scale = max|w| / 2^(bits-1)`` in float32; ``round`` (halves away from zero),
clamp to the signed range; int4 packs column 2j in the low nibble; the scale is returned in the weight's
dtype. The GPU-specific layout ``preprocess_weights_for_mixed_gemm`` gives the bytes (permuted and interleaved
by SM version) is modelled as opaque: the rows are permuted and the bytes interleaved in groups of four (not
upstream's permutation, which depends on the GPU), so nothing may read the result as a plain ``[in, out]`` matrix.
"""

import fnmatch

import torch

QUANT_WEIGHTS = ["qkv.weight", "dense.weight", "fc.weight", "proj.weight", "gate.weight"]


def symmetric_quantize(weight_t, bits):
    """One ``[in, out]`` matrix or a batch ``[experts, in, out]`` (each matrix on its own)."""
    w = weight_t.float()
    amax = w.abs().amax(dim=-2)
    scale = amax / float(2 ** (bits - 1))
    q = torch.where(scale[..., None, :] == 0, torch.zeros_like(w),
                    torch.trunc(w / scale[..., None, :] + torch.sign(w) * 0.5))
    q = q.clamp(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1).to(torch.int8)
    if bits == 4:
        lo, hi = q[..., 0::2], q[..., 1::2]
        q = ((lo & 0x0F) | ((hi & 0x0F) << 4)).to(torch.int8)
    return mixed_gemm_layout(q), scale.to(weight_t.dtype)


def mixed_gemm_layout(q):
    """The opaque layout (module doc); shapes are kept."""
    rows, cols = q.shape[-2], q.shape[-1]
    if rows % 8 or cols % 4:
        return q.flip(-1).contiguous()
    order = torch.arange(rows).reshape(-1, 8).flip(-1).reshape(-1)
    q = q[..., order, :]
    return q.reshape(*q.shape[:-1], 4, cols // 4).transpose(-1, -2).reshape(q.shape).contiguous()


def weight_only_quantize_dict(weights, quant_algo, exclude_modules=None):
    bits = 8 if quant_algo == "W8A16" else 4
    exclude = exclude_modules if exclude_modules is not None else ["*shared_expert_gate.weight"]
    for name in list(weights):
        w = weights[name]
        if any(q in name for q in QUANT_WEIGHTS) and not any(fnmatch.fnmatchcase(name, p) for p in exclude) \
                and w.dtype != torch.int8:
            q, scale = symmetric_quantize(w.transpose(-1, -2).contiguous(), bits)  # 3-D: stacked experts
            weights[name] = q
            weights[name.replace(".weight", ".per_channel_scale")] = scale
    return weights
