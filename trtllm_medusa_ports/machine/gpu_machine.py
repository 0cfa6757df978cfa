"""What the GPU machine needs, said once: every message, script and document that tells a user how to get TensorRT-LLM
or its source takes its text from here (tests/test_gpu_machine.py holds the README, pyproject.toml and the tool's
errors to it).

TensorRT-LLM's own instructions for its pip wheel (``docs/source/installation/linux.md``): a CUDA toolkit with
``CUDA_HOME`` set and MPI first, then the wheel from PyPI, whose ``tensorrt_llm`` package fetches the build for the
machine from NVIDIA's index; or one of NVIDIA's release containers (``nvcr.io/nvidia/tensorrt-llm/release``) of the
same version, which carries all of it. ``trtllm-build`` and the TensorRT engine flow end with the 1.2 line.

run.sh needs ``examples/run.py`` and the Triton route ``triton_backend/`` (templates, ``tools/fill_template.py``,
``scripts/launch_triton_server.py``): neither is in the wheel, so the scripts read them from a source checkout of the
installed version's tag.
"""

#: TensorRT-LLM versions whose source the engine adapters were written against: 1.2.x, the last line with the
#: TensorRT engine flow (``trtllm-build``)
SUPPORTED_TRTLLM = ">=1.2.0rc2,<1.3"
#: TensorRT-LLM's install, pinned to that line (a CUDA toolkit with CUDA_HOME set comes first)
INSTALL_COMMAND = ("sudo apt-get -y install libopenmpi-dev && pip3 install --upgrade pip setuptools && "
                   f"pip3 install 'tensorrt_llm{SUPPORTED_TRTLLM}'")
#: the source checkout of the installed version, for run.py and the Triton templates
CHECKOUT_COMMAND = ('git clone --depth 1 --branch "v$(python3 -c \'import tensorrt_llm; '
                    'print(tensorrt_llm.__version__)\')" https://github.com/NVIDIA/TensorRT-LLM')
INSTALL_HINT = (f"on a machine with an NVIDIA GPU and a CUDA toolkit (CUDA_HOME set): {INSTALL_COMMAND} (TensorRT-LLM's "
                "own instructions, pinned to the 1.2 line, the last with trtllm-build), or use NVIDIA's 1.2.x release "
                "container nvcr.io/nvidia/tensorrt-llm/release")
#: what each route's scripts read from that checkout
NEEDS = {"TRTLLM_EXAMPLES": f"set TRTLLM_EXAMPLES to the examples/ directory of a TensorRT-LLM source checkout of the "
                            f"installed version ({CHECKOUT_COMMAND})",
         "TRTLLM_TRITON": f"set TRTLLM_TRITON to the triton_backend/ directory of a TensorRT-LLM source checkout of the "
                          f"installed version ({CHECKOUT_COMMAND})"}
