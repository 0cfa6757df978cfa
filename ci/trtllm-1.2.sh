#!/usr/bin/env bash
# The README's test command in TensorRT-LLM 1.2's environment: a venv of the versions it pins
# (ci/trtllm-1.2-pins.txt: torch 2.9.0, transformers 4.57.1, numpy < 2), where users run `trtllm-medusa build`,
# the serving bundle and, on a GPU machine, convert and verify. The venv is made once and kept
# (TRTLLM_MEDUSA_CI_VENV, default ~/.cache/trtllm-medusa-ports/venv-trtllm-1.2): torch 2.9.0 is a CUDA build of
# about 7 GB (it runs on the CPU), about 2 minutes to install; the project itself is installed into it each run.
set -euo pipefail
cd "$(dirname "$0")/.."
pins=ci/trtllm-1.2-pins.txt
venv=${TRTLLM_MEDUSA_CI_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/trtllm-medusa-ports/venv-trtllm-1.2}
wanted=$(grep -v '^#' "$pins" | tr '\n' ' ')
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.pins" 2>/dev/null)" != "$wanted" ]; then
  rm -rf "$venv"
  # a machine that cannot hold or fetch the pinned torch (about 7 GB) is not a failing suite: said loudly, not failed
  if ! { python3 -m venv "$venv" && "$venv/bin/python" -m pip install -q -r "$pins"; }; then
    rm -rf "$venv"
    echo "WARNING: TensorRT-LLM 1.2's environment could not be installed here ($(df -h "$(dirname "$venv")" | \
awk 'NR==2 {print $4 " free"}')): the suite did NOT run in it" >&2
    exit 0
  fi
  echo "$wanted" > "$venv/.pins"
fi
"$venv/bin/python" -m pip install -q -c "$pins" -e '.[test]'
"$venv/bin/python" -c 'import numpy, torch, transformers; print(f"TensorRT-LLM 1.2 environment: torch {torch.__version__}, transformers {transformers.__version__}, numpy {numpy.__version__}")'
# README, "Run the tests", with this venv's python
exec "$venv/bin/python" -m pytest -p no:cacheprovider "$@"
