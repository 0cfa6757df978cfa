"""The GPU machine's side, said once (issue 64, 7): the install line, the source checkout the scripts need and the
supported TensorRT-LLM line come from trtllm_medusa_ports/machine/gpu_machine.py, and every place a user reads them says
that text: the README, pyproject.toml's extra, the tool's errors, the bundle's scripts and deploy's summary."""

import re
import subprocess
from pathlib import Path

import pytest
import tomllib

from trtllm_medusa_ports.machine.gpu_machine import (
    CHECKOUT_COMMAND,
    INSTALL_COMMAND,
    NEEDS,
    SUPPORTED_TRTLLM,
)

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_and_pyproject_say_what_the_tool_says():
    readme = (ROOT / "README.md").read_text()
    assert INSTALL_COMMAND in readme and CHECKOUT_COMMAND in readme
    assert "extra-index-url" not in readme  # TensorRT-LLM's own instructions take the wheel from PyPI
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["trtllm"] == [f"tensorrt_llm{SUPPORTED_TRTLLM}"]
    assert f"'tensorrt_llm{SUPPORTED_TRTLLM}'" in INSTALL_COMMAND
    guide = (ROOT / "docs" / "user-guide.md").read_text()
    assert "1.2.x source checkout" not in guide and CHECKOUT_COMMAND in guide


def test_the_tools_install_hint_is_that_line(monkeypatch):
    import sys

    from trtllm_medusa_ports.engine import EngineUnavailable, require_tensorrt_llm

    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)  # import raises ImportError
    with pytest.raises(EngineUnavailable) as e:
        require_tensorrt_llm()
    assert INSTALL_COMMAND in e.value.fix and "nvcr.io/nvidia/tensorrt-llm/release" in e.value.fix


def test_a_script_without_its_checkout_names_the_checkout_and_runs_nothing(tmp_path):
    """run.sh without TRTLLM_EXAMPLES: one error line naming the variable and the checkout command, as text (the
    command in it is not run: the message is a quoted literal), exit 1."""
    from trtllm_medusa_ports.deploy.bundle import _script

    script = tmp_path / "run.sh"
    script.write_text(_script(["exec true"], {}, needs=("TRTLLM_EXAMPLES",)))
    marker = tmp_path / "ran"
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    (tmp_path / "python3").write_text(f"#!/bin/sh\ntouch {marker}\n")  # were the $(python3 ...) run, it would show
    (tmp_path / "python3").chmod(0o755)
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 1 and not marker.exists()
    assert done.stderr.strip() == "error: " + NEEDS["TRTLLM_EXAMPLES"]
    assert CHECKOUT_COMMAND in done.stderr and re.search(r"TRTLLM_EXAMPLES to the examples/ directory", done.stderr)
