"""The calibration flags around the stages: convert's policy for calibration flags that do not apply (a warning,
never ignored in silence) and the samples verify re-derives a tool's scales from.

May import: errors, convert (ConvertOptions), and lazily quant, devices and quant.calibrate; never api or cli.
"""

from __future__ import annotations

from pathlib import Path

from trtllm_medusa_ports.conversion.convert import ConvertOptions
from trtllm_medusa_ports.errors import ConversionError

#: convert's flags of the calibration pass, with their defaults
CALIBRATION_FLAGS = (("--calib_dataset", "calib_dataset", None), ("--calib_size", "calib_size", 512),
                     ("--calib_max_seq_length", "calib_max_seq_length", 512),
                     ("--tokenizer_dir", "tokenizer_dir", None), ("--device", "device", "cpu"),
                     ("--threads", "threads", None))


def check_calibration_flags(opts: ConvertOptions) -> list[str]:
    """The warning for calibration flags set on a conversion that runs no calibration (a float or weight-only
    format, or a given ``ConvertOptions.calibration``): never ignored in silence. A path among them that does not
    exist is an error (a typo would otherwise pass unseen). Where a calibration runs, ``--device`` is checked by
    computing on it (devices.check_device) before anything is read."""
    from trtllm_medusa_ports.quant import spec_from_flags

    spec = spec_from_flags(opts)
    if spec.needs_calibration and opts.calibration is None:
        from trtllm_medusa_ports.machine.devices import check_device

        check_device(opts.device, "--device", ConversionError)
        return []
    given = [flag for flag, name, default in CALIBRATION_FLAGS if getattr(opts, name) != default]
    for flag, name in (("--calib_dataset", "calib_dataset"), ("--tokenizer_dir", "tokenizer_dir")):
        path = getattr(opts, name)
        if path is not None and not Path(path).exists():
            raise ConversionError(f"{flag}: no such file or directory (and nothing is calibrated: the flag does not "
                                  "apply)", where=str(path), fix=f"drop {flag}, or correct the path")
    if not given:
        return []
    if spec.needs_calibration:
        why = "ConvertOptions.calibration is given and used as it is"
    elif spec.weight_only:
        why = (f"weight-only {spec.quant_algo} calibrates nothing (TensorRT-LLM quantizes the weights at load, from "
               "the weights alone)")
    else:
        why = "a float checkpoint calibrates nothing"
    return [f"{', '.join(given)}: ignored, {why}; drop {'it' if len(given) == 1 else 'them'}, or calibrate with "
            "--qformat fp8 or --kv_cache_dtype fp8 / int8"]


def tool_calibration(opts) -> list[list[int]] | None:
    """The calibration samples given for a tool's checkpoint (token ids), or None (``opts``: an
    api.VerifyOptions)."""
    if opts.calib_dataset is None:
        return None
    from trtllm_medusa_ports.quant.calibrate import read_calibration_samples

    samples, _ = read_calibration_samples(opts.calib_dataset, Path(opts.model_dir), size=opts.calib_size,
                                          max_seq_length=opts.calib_max_seq_length, tokenizer_dir=opts.tokenizer_dir)
    return samples
