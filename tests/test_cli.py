import subprocess
import sys

from trtllm_medusa_ports import __version__
from trtllm_medusa_ports.cli import main


def test_demo_is_the_end_to_end_job(tmp_path, capsys):
    assert main(["demo", "--workdir", str(tmp_path / "demo"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "logits parity     : PASS" in out and "greedy equivalence: PASS" in out
    assert "architecture MedusaForCausalLM, dtype float16" in out and "RESULT: OK" in out
    assert (tmp_path / "demo" / "trtllm_checkpoint" / "rank1.safetensors").is_file()


def test_module_entry_point():
    r = subprocess.run([sys.executable, "-m", "trtllm_medusa_ports", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == __version__
    r = subprocess.run([sys.executable, "-m", "trtllm_medusa_ports", "tree", "--list_presets"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "mc_sim_7b_63" in r.stdout.split()


def test_top_level_help_speaks_to_users_with_one_example_per_command(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "thin command line" not in out and "exit codes:" in out
    for command in ("check", "convert", "verify", "build", "train-heads", "tune-tree", "tree", "inspect-heads", "demo"):
        assert f"  trtllm-medusa {command} " in out or out.rstrip().endswith(f"trtllm-medusa {command}") or \
            f"  trtllm-medusa {command}\n" in out, command
