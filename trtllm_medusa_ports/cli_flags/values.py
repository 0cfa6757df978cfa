"""What the commands read from their flags beyond one value each (paths, the prompts, the MoE split, the device
they compute on) and how a command's result is printed.

May import: the standard library, declared, errors, and lazily devices, quant and files.prompts; never cli or api.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trtllm_medusa_ports import declared
from trtllm_medusa_ports.errors import PortError


def print_result(args: argparse.Namespace, result) -> None:
    """The command's result: ``to_dict()`` as JSON with --json, else its text."""
    print(json.dumps(result.to_dict(), indent=2) if getattr(args, "json", False) else result.render())


def options_from(owner: str, parsed: argparse.Namespace, /, **given) -> dict:
    """The keyword arguments of the API's ``owner`` options class from the parsed flags: each field declared with a
    flag (declared.py), read from the flag's dest (a path as a Path, an empty one as None), then ``given``: the
    fields the command computes from several flags (the prompts, convert's dtype and MoE split, ...)."""
    out = {}
    for o in declared.owned(owner):
        spellings = o.spellings
        if not spellings or o.name in given:
            continue
        if not hasattr(parsed, o.parsed_dest):
            continue
        out[o.name] = flag_value(o, getattr(parsed, o.parsed_dest))
    return {**out, **given}


def flag_value(o: declared.Option, v):
    """The API's value of a flag's: a path as a Path (an empty one None), and 0 as None where the flag's own range
    admits 0 for an API field that takes None instead (``--batch_size 0``: every position)."""
    if o.spec.kind == "path":
        return Path(v) if v else None
    if v == 0 and o.cli_spec is not None and o.cli_spec.lo == 0 and o.spec.none and (o.spec.lo or 0) > 0:
        return None
    return v


def port_stages(args: argparse.Namespace) -> dict[str, dict]:
    """port's stage options from the flags the user gave (declared.port_routes; a flag not given is absent): per
    stage, its options' fields (paths as Paths, the prompts as one PromptInputs, train-heads' fit fields under
    ``"fit"``, each value as :func:`flag_value` reads it)."""
    fit_fields = {o.name for o in declared.owned("FitOptions")}
    prompt_flags = ("prompt", "prompts_file", "prompt_ids", "data")
    stages: dict[str, dict] = {}
    for name, (o, to) in declared.port_routes().items():
        if not hasattr(args, o.parsed_dest) or name in prompt_flags:
            continue
        v = flag_value(o, getattr(args, o.parsed_dest))
        field = o.dest or name  # --no_streaming: the streaming field
        for stage in to:
            fields = stages.setdefault(stage, {})
            if stage == "train-heads" and field in fit_fields:
                fields.setdefault("fit", {})[field] = v
            else:
                fields[field] = v
    if any(hasattr(args, f) for f in prompt_flags):
        given = argparse.Namespace(**{f: getattr(args, f, None) for f in prompt_flags})
        for stage in declared.PORT_ONLY_TO["prompt"]:
            stages.setdefault(stage, {})["prompts"] = prompt_inputs(given)
    return stages


def changed_flags(command: str, names, parsed: argparse.Namespace) -> list[str]:
    """The flags among ``names`` (fields of ``command``'s declared options) given a value other than their default,
    by their first spelling."""
    by = {o.name: o for o in declared.COMMANDS[command][2]}
    return [by[n].spellings[0] for n in names if getattr(parsed, by[n].parsed_dest) != by[n].flag_default]


def prompt_inputs(args: argparse.Namespace):
    """--prompt / --prompts_file / --prompt_ids / --data, as every command reads them (files/prompts.py)."""
    from trtllm_medusa_ports.files.prompts import PromptInputs, parse_prompt_ids

    return PromptInputs(prompt=list(args.prompt or []),
                        prompts_file=Path(args.prompts_file) if args.prompts_file else None,
                        prompt_ids=parse_prompt_ids(args.prompt_ids) if args.prompt_ids else None,
                        data=Path(args.data) if args.data else None)


def moe_ep_size(args: argparse.Namespace) -> int | None:
    """Expert parallelism from --moe_ep_size / --moe_tp_size (upstream's pair, -1 each: resolved as
    tensorrt_llm/mapping.py does); a usage PortError where they contradict --tp_size."""
    ep, tpm, tp = args.moe_ep_size, args.moe_tp_size, args.tp_size
    if ep == -1:
        ep = 1 if tpm == -1 else (tp // tpm if tpm > 0 and tp % tpm == 0 else 0)
    if ep < 1 or (tpm != -1 and tpm * ep != tp):
        raise PortError(f"--moe_tp_size {args.moe_tp_size} x --moe_ep_size {args.moe_ep_size} must equal --tp_size {tp}",
                        fix="pass one of them (the other is tp_size divided by it)", usage=True)
    return ep


def calibration_device_ok(args: argparse.Namespace) -> bool:
    """``--device`` where a calibration pass will compute on it, checked by doing so (devices.check_device: meta,
    cuda without CUDA, an ordinal past the GPUs, a bad name); a usage PortError where it does not."""
    from trtllm_medusa_ports.quant import spec_from_flags

    if not spec_from_flags(args).needs_calibration:
        return True  # a flag that does not apply: api.convert warns
    return device_ok(args.device)


def device_ok(device: str) -> bool:
    """Whether ``--device`` computes (devices.check_device); a usage PortError where it does not."""
    from trtllm_medusa_ports.machine.devices import check_device

    try:
        check_device(device, "--device")
    except PortError as exc:
        exc.usage = True
        raise
    return True
