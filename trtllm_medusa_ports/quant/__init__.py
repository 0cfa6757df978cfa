"""Quantized Medusa checkpoints: which formats, which tensors, and the exact arithmetic of each.

TensorRT-LLM 1.2.x facts this module follows (repository NVIDIA/TensorRT-LLM unless named):

* **Weight-only (W8A16, W4A16)**: the checkpoint keeps float weights and names ``quant_algo``;
  ``tensorrt_llm/models/modeling_utils.py`` ``preprocess_weights`` -> ``weight_only_quantize_dict``
  (``tensorrt_llm/models/convert_utils.py``) quantizes at load every tensor whose name contains
  ``qkv.weight``, ``dense.weight``, ``fc.weight``, ``proj.weight`` or ``gate.weight`` and matches no
  ``exclude_modules`` pattern (``fnmatch.fnmatchcase`` on the tensor name), per rank (the rank files are
  already split). The quantizer (``cpp/tensorrt_llm/kernels/cutlass_kernels/cutlass_preprocessors.cpp``
  ``symmetric_quantize``) works on the transposed ``[in, out]`` weight: per output channel
  ``scale = max|w| / 128`` (int8) or ``/ 8`` (int4) in float32, no epsilon; ``q = round(w / scale)``
  with C ``round`` (halves away from zero), clamped to [-128, 127] or [-8, 7] (0 where the scale is 0);
  the scale is stored in the weight's dtype and the GEMM computes ``q * stored_scale``.
* **FP8** (per tensor, as NVIDIA's exporter ``modelopt/torch/export/`` in NVIDIA/TensorRT-Model-Optimizer
  writes it): ``weight`` float8_e4m3fn ``= (w / s_w).to(float8_e4m3fn)``, ``weights_scaling_factor``
  ``s_w = amax(w) / 448`` and ``activation_scaling_factor`` ``s_a = amax(x) / 448`` (max calibration),
  float32 ``[1]``; q, k and v share the max of their amaxes (``preprocess_linear_fusion``), and so do
  ``mlp.fc`` and ``mlp.gate``; scales are those of the unsplit tensor, the same on every rank.
  ``tensorrt_llm/quantization/layers.py`` ``FP8Linear.forward`` quantizes its input with
  ``s_a`` cast to the model dtype (``x / s_a``, round to nearest even, saturated to +-448) and scales the
  product by ``s_w * s_a`` (float32).
* **KV cache**: ``transformer.layers.{i}.attention.kv_cache_scaling_factor`` float32 ``[1]``;
  ``preprocess_weights`` adds ``kv_cache_rcp_scaling_factor = 1 / scale``; the kernels write
  ``sat(rne(x * rcp))`` and read ``q * scale`` (``decoderMaskedMultiheadAttentionUtils.h``). INT8:
  ``scale = max|qkv output| / 127`` before RoPE, q included (``tensorrt_llm/models/llama/convert.py``
  ``int8_kv_cache``); FP8: ``max(amax / 448, 1)`` (ModelOpt ``get_kv_cache_scaling_factor``).
* **What stays in float**: ``exclude_modules`` replaces upstream's default list (it is not merged,
  ``tensorrt_llm/quantization/quantize.py`` ``quantize_layers``), so ours repeats that default and adds
  ``*medusa_heads*`` as ``quantize_by_modelopt.py`` ``combine_medusa_weight`` does: the Medusa ResBlocks
  and lm_heads, the base lm_head, the embedding and the norms keep the checkpoint dtype.

The arithmetic and the rules live in this package's modules; this face hands their names on:

* ``spec.py``: the formats' flags, ``QuantSpec``, which tensors each format quantizes, scale groups, names;
* ``numerics.py``: weight-only, FP8 and KV-cache arithmetic;
* ``stored.py``: what a quantized checkpoint's rank files must hold.

May import: ``archs``, ``weights``, ``files``, ``findings``, ``gpu`` (the XQA routes), ``huggingface``
(calibration), ``conversion.plan`` (the jobs), ``machine``, ``errors``; ``quant.prequantized``, a stage
(docs/layers.md), also ``compat``, ``deploy.commands``, ``heads`` and ``trees``.
"""

from trtllm_medusa_ports.quant.numerics import *  # noqa: F403
from trtllm_medusa_ports.quant.spec import *  # noqa: F403
from trtllm_medusa_ports.quant.stored import *  # noqa: F403
