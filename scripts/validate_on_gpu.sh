#!/usr/bin/env bash
# Validate Medusa engines on a GPU machine with TensorRT-LLM 1.2.x installed:
# convert -> verify --device cuda (in memory and streaming) -> trtllm-medusa build -> run with --medusa_choices
# -> compare with HF greedy; then the serving bundle of trtllm-medusa deploy, every route (run.py, the LLM API,
# trtllm-serve, Triton where installed) against the base's greedy text.
# Prints a PASS/FAIL table per family. Not run in CI (no GPU, no TensorRT-LLM there).
#
#   scripts/validate_on_gpu.sh [RUN_PY] [WORKDIR]
#   RUN_PY: TensorRT-LLM's examples/run.py (default: $TRTLLM_ROOT/examples/run.py)
#   FAMILIES: architectures to run (default: every family the registry holds whose tiny model check accepts)
#   QFORMAT: a --qformat for every conversion (fp8, int8_wo, int4_wo; default: none). Widths are set to
#            multiples of 256 so that weight-only layers need no padding; MoE bases refuse fp8 (port-limit)
set -euo pipefail
RUN_PY=${1:-${TRTLLM_ROOT:-/opt/TensorRT-LLM}/examples/run.py}
WORK=${2:-$(mktemp -d)}
FAMILIES=${FAMILIES:-$(python3 -c "
from trtllm_medusa_ports.archs.registry import family_test_cases
print(' '.join(a for a, errors in family_test_cases()['verdicts'] if not errors))")}
QFORMAT=${QFORMAT:-}
TREE='[[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0]]'
NEW=24

python3 -c "import tensorrt_llm; print('TensorRT-LLM', tensorrt_llm.__version__)" || {
  echo "TensorRT-LLM is not importable: install tensorrt_llm 1.2.x on a GPU machine" >&2; exit 1; }
[ -f "$RUN_PY" ] || { echo "examples/run.py not found at $RUN_PY (pass it as the first argument)" >&2; exit 1; }

# verify on the GPU (the code path CPU tests drive with --device cpu): in memory and streaming, each must pass and
# the two reports must be the same but for memory_mode (weight-only streams; other quantized formats do not)
verify_on_cuda() {
  local d=$1 modes="--no_streaming"
  case "$QFORMAT" in ""|int8_wo|int4_wo) modes="--no_streaming --streaming" ;; esac
  for m in $modes; do
    trtllm-medusa verify --model_dir "$d/base" --checkpoint_dir "$d/ckpt" --medusa_choices "$TREE" \
      --max_new_tokens 8 --device cuda "$m" --json --quiet >"$d/verify-cuda$m.json" 2>>"$d/verify-cuda.log" || return 1
  done
  [ "$modes" = "--no_streaming" ] && return 0
  python3 - "$d" >>"$d/verify-cuda.log" 2>&1 <<'PY'
import json, sys
a, b = (json.load(open(f"{sys.argv[1]}/verify-cuda{m}.json")) for m in ("--no_streaming", "--streaming"))
print("memory modes:", a.pop("memory_mode")["mode"], b.pop("memory_mode")["mode"])
differ = [k for k in a if a[k] != b[k]]
sys.exit(f"streaming and in-memory reports differ in {differ}" if differ else 0)
PY
}

printf '%-24s %-6s %s\n' family result detail
for arch in $FAMILIES; do
  d="$WORK/$arch"; mkdir -p "$d"
  python3 - "$arch" "$d" "$QFORMAT" <<'PY'
import sys
from pathlib import Path
from trtllm_medusa_ports.archs import adapter_for
from trtllm_medusa_ports.fixtures.synthetic import save_heads, save_tiny_base, save_tiny_tokenizer, train_heads
from trtllm_medusa_ports.files.hf_model import HFConfig
arch, d, qformat = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
tiny = adapter_for(arch).tiny_config
# head size 64: a size the precompiled XQA Medusa kernels have (families that declare head_dim set it)
sizes = {"head_dim": 64} if "head_dim" in tiny else {}
if qformat:  # weight-only layers pad to 64 x tp: every width a multiple of 256
    sizes.update({k: 256 for k in ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size")
                  if k in tiny})
save_tiny_base(arch, d / "base", embedding_gain=8.0, hidden_size=256, num_attention_heads=4, **sizes)
# examples/run.py always loads a tokenizer from --tokenizer_dir (examples/utils.py load_tokenizer);
# a folder of its own, so that transformers does not pick the family's tokenizer class from config.json
save_tiny_tokenizer(d / "tokenizer", HFConfig.read(d / "base").get("vocab_size"))
save_heads(train_heads(d / "base", num_heads=3), d / "heads")
PY
  status=PASS; detail=""
  if ! trtllm-medusa convert --model_dir "$d/base" --medusa_model_dir "$d/heads" --output_dir "$d/ckpt" \
        --dtype float16 --max_medusa_token_len 7 ${QFORMAT:+--qformat "$QFORMAT"} --overwrite --quiet \
        >"$d/convert.log" 2>&1; then
    status=FAIL; detail="convert (see $d/convert.log)"
  elif ! verify_on_cuda "$d"; then
    status=FAIL; detail="verify --device cuda (see $d/verify-cuda.log)"
  elif ! trtllm-medusa build --checkpoint_dir "$d/ckpt" --output_dir "$d/engine" --gemm_plugin auto \
        --max_batch_size 1 >"$d/build.log" 2>&1; then
    status=FAIL; detail="build (see $d/build.log)"
  else
    python3 - "$d" "$RUN_PY" "$TREE" "$NEW" >"$d/compare.log" 2>&1 <<'PY' || { status=FAIL; detail="$(tail -1 "$d/compare.log")"; }
import subprocess, sys
import torch
from trtllm_medusa_ports.verify import hf_greedy, load_hf_model
d, run_py, tree, new = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
prompt = [11, 18, 25, 32, 39, 46]
expected = hf_greedy(load_hf_model(f"{d}/base", torch.float16), prompt, new)
import numpy as np
np.savetxt(f"{d}/prompt.csv", np.array([prompt]), delimiter=",", fmt="%d")
out = subprocess.run([sys.executable, run_py, "--engine_dir", f"{d}/engine", "--tokenizer_dir", f"{d}/tokenizer",
                      "--input_file", f"{d}/prompt.csv",
                      "--max_output_len", str(new), "--medusa_choices", tree, "--temperature", "1.0",
                      "--output_npy", f"{d}/out.npy"], capture_output=True, text=True)
if out.returncode:
    sys.exit(f"run.py failed: {out.stderr.strip().splitlines()[-1] if out.stderr else out.returncode}")
got = np.load(f"{d}/out.npy").reshape(-1).tolist()[len(prompt):len(prompt) + new]
print("expected", expected); print("got     ", got)
sys.exit(0 if got == expected else f"differs at {next(i for i, (a, b) in enumerate(zip(expected, got)) if a != b)}")
PY
  fi
  printf '%-24s %-6s %s\n' "$arch" "$status" "$detail"
done

# Refused build flags (rule engine-build-flag): trtllm-medusa build must exit 1 on each; the same flag with
# upstream's own MedusaForCausalLM (a Llama checkpoint) through plain trtllm-build shows what the refusal avoids
# (a failed build or output that differs from greedy).
d="$WORK/LlamaForCausalLM"
for flags in "--gpt_attention_plugin disable" "--kv_cache_type disabled" "--tokens_per_block 8" "--max_beam_width 2"; do
  if [ -d "$d/ckpt" ] && ! trtllm-medusa build --checkpoint_dir "$d/ckpt" --output_dir "$WORK/refused" $flags \
        >"$WORK/refused.log" 2>&1; then status=PASS; else status=FAIL; fi
  printf '%-24s %-6s %s\n' "refuse $flags" "$status" "trtllm-medusa build exits 1"
  plain="$WORK/plain-${flags// /_}"
  if trtllm-build --checkpoint_dir "$d/ckpt" --output_dir "$plain" --speculative_decoding_mode medusa $flags \
        >"$plain.log" 2>&1; then
    printf '%-24s %-6s %s\n' "plain $flags" "INFO" "upstream built it: compare $plain with run.py by hand"
  else
    printf '%-24s %-6s %s\n' "plain $flags" "INFO" "upstream failed too (see $plain.log)"
  fi
done

# Gemma 3 with linear RoPE scaling (rule engine-divergence): written with --allow_unsupported, the engine
# must compute what the reference executor computes (local layers scaled too), not what transformers does.
g="$WORK/gemma3-scaled"; mkdir -p "$g"
python3 - "$g" <<'PY'
import sys
from pathlib import Path
from trtllm_medusa_ports.fixtures.synthetic import save_heads, save_tiny_base, save_tiny_tokenizer, train_heads
from trtllm_medusa_ports.files.hf_model import HFConfig
d = Path(sys.argv[1])
save_tiny_base("Gemma3ForCausalLM", d / "base", embedding_gain=8.0, hidden_size=256, num_attention_heads=4,
               head_dim=64, rope_scaling={"rope_type": "linear", "factor": 8.0})
save_tiny_tokenizer(d / "tokenizer", HFConfig.read(d / "base").get("vocab_size"))
save_heads(train_heads(d / "base", num_heads=3), d / "heads")
PY
if trtllm-medusa convert --model_dir "$g/base" --medusa_model_dir "$g/heads" --output_dir "$g/ckpt" --dtype float16 \
      --max_medusa_token_len 7 --allow_unsupported --overwrite --quiet >"$g/convert.log" 2>&1 && \
   trtllm-medusa build --checkpoint_dir "$g/ckpt" --output_dir "$g/engine" --max_batch_size 1 >"$g/build.log" 2>&1; then
  python3 - "$g" "$RUN_PY" "$TREE" "$NEW" <<'PY' && status=PASS || status=FAIL
import subprocess, sys
import numpy as np
from trtllm_medusa_ports.reference import ReferenceModel, plain_generate
d, run_py, tree, new = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
prompt = [11, 18, 25, 32, 39, 46]
expected = plain_generate(ReferenceModel(f"{d}/ckpt"), prompt, new)  # the engine's arithmetic
np.savetxt(f"{d}/prompt.csv", np.array([prompt]), delimiter=",", fmt="%d")
subprocess.run([sys.executable, run_py, "--engine_dir", f"{d}/engine", "--tokenizer_dir", f"{d}/tokenizer",
                "--input_file", f"{d}/prompt.csv", "--max_output_len", str(new), "--medusa_choices", tree,
                "--temperature", "1.0", "--output_npy", f"{d}/out.npy"], check=True)
got = np.load(f"{d}/out.npy").reshape(-1).tolist()[len(prompt):len(prompt) + new]
sys.exit(0 if got == expected else "engine differs from the reference executor's scaled-local-RoPE output")
PY
else status=FAIL; fi
printf '%-24s %-6s %s\n' "gemma3 rope_scaling" "$status" "engine = executor (local layers scaled)"

# The serving bundle (trtllm-medusa deploy) of one of our classes (GPT-NeoX: MedusaPorts, built with trtllm-medusa
# build): build.sh, then every route on one prompt - run.py, the LLM API, one trtllm-serve request and, where
# TRTLLM_TRITON names TensorRT-LLM's triton_backend/ and tritonserver is installed, Triton - each route's text against
# the base's greedy text through the same tokenizer. Untested here: written on a machine without a GPU.
route() {  # route NAME STATUS DETAIL
  printf '%-24s %-6s %s\n' "deploy: $1" "$2" "$3"
}
src="$WORK/GPTNeoXForCausalLM"; b="$WORK/bundle"
if [ -d "$src/ckpt" ] && trtllm-medusa deploy --checkpoint_dir "$src/ckpt" --tokenizer_dir "$src/tokenizer" \
      --output_dir "$b" --medusa_choices "$TREE" --max_batch_size 1 --max_seq_len 64 --max_input_len 16 --overwrite \
      --json >"$WORK/bundle.json" 2>"$WORK/bundle.log" && "$b/build.sh" >"$WORK/bundle-build.log" 2>&1; then
  route build PASS "$b/build.sh"
  expected=$(python3 - "$src" <<'PY'
import sys
import torch
from transformers import AutoTokenizer
from trtllm_medusa_ports.verify import hf_greedy, load_hf_model
d = sys.argv[1]
tok = AutoTokenizer.from_pretrained(f"{d}/tokenizer")
prompt = tok("t11 t18 t25 t32", add_special_tokens=False)["input_ids"]
print(tok.decode(hf_greedy(load_hf_model(f"{d}/base", torch.float16), prompt, 8)))
PY
)
  check() {  # check NAME LOG
    if grep -qF -- "$expected" "$2"; then route "$1" PASS "the base's greedy text"; else route "$1" FAIL "see $2"; fi
  }
  TRTLLM_EXAMPLES=$(dirname "$RUN_PY") "$b/run.sh" "t11 t18 t25 t32" >"$WORK/route-run.log" 2>&1 || true
  check run.py "$WORK/route-run.log"
  python3 "$b/llm_api.py" "t11 t18 t25 t32" >"$WORK/route-llm.log" 2>&1 || true
  check llm_api "$WORK/route-llm.log"
  "$b/serve.sh" >"$WORK/route-serve-server.log" 2>&1 & server=$!
  for _ in $(seq 120); do curl -sf localhost:8000/health >/dev/null 2>&1 && break; sleep 2; done
  curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' \
    -d '{"model": "engine", "prompt": "t11 t18 t25 t32", "max_tokens": 48, "top_k": 1}' >"$WORK/route-serve.log" 2>&1
  kill "$server" 2>/dev/null || true
  check trtllm-serve "$WORK/route-serve.log"
  if [ -n "${TRTLLM_TRITON:-}" ] && command -v tritonserver >/dev/null; then
    "$b/triton/fill.sh" >"$WORK/route-triton-fill.log" 2>&1 && { "$b/triton/launch.sh" >"$WORK/route-triton-server.log" 2>&1 & }
    for _ in $(seq 120); do curl -sf localhost:8000/v2/health/ready >/dev/null 2>&1 && break; sleep 2; done
    curl -s localhost:8000/v2/models/ensemble/generate -d \
      '{"text_input": "t11 t18 t25 t32", "max_tokens": 48, "bad_words": "", "stop_words": ""}' >"$WORK/route-triton.log" 2>&1
    pkill -f tritonserver || true
    check triton "$WORK/route-triton.log"
  else
    route triton SKIP "set TRTLLM_TRITON and install tritonserver"
  fi
else
  route build FAIL "see $WORK/bundle.log and $WORK/bundle-build.log"
fi
echo "artifacts in $WORK"
