"""What a run checks before transformers is even imported: that its output_dir's names fit the filesystem, that no
other run owns it, that its sizes and counts fit the machine (config.bounds), that the machine has the hardware
the recipe's precision needs, that a recipe recorded by a run on N processes (config.yaml's ``num_processes``)
runs on N, that push_to_hub has a Hub to reach, that every key is known, and that the tokenizer can be loaded
(shipped, a local directory without custom code, or a Hub id in the cache when offline: an offline run of the
default Hub tokenizer was refused only after 20 s of imports).

Both must answer before ``parse_args`` (which builds ``TrainingArguments``: 5-6 s of imports on a loaded 2-core
machine). A second run into a busy directory is refused in well under 2 s; a bf16 recipe on a machine without a
bf16 GPU gets our one line naming the override, instead of transformers' ``Your setup doesn't support bf16/gpu``
raised inside ``TrainingArguments.__post_init__``; where no GPU is visible at all (``hf_optbench.machine.gpu_visible``:
device files, no CUDA initialisation) it answers without importing torch, also under ``accelerate launch``. The values are read from the recipe and the command line
with the same precedence as :func:`hf_optbench.config.parse.parse_args` (CLI over recipe), for the few keys
these checks need; parse_args still validates everything afterwards.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any

from hf_optbench.config.argv import attach_negative_values
from hf_optbench.config.bounds import SYNTHETIC_KEYS, check_run_bounds
from hf_optbench.config.checks import RUN_DIR_LONGEST_INSIDE, check_path_fits
from hf_optbench.config.data_args import DataArguments
from hf_optbench.config.parse import (
    TRAINING_DEFAULTS,
    RunConfig,
    _split_argv,
    check_keys,
    check_num_processes,
    load_recipe,
)
from hf_optbench.data.tokenizers import check_tokenizer_available
from hf_optbench.errors import OptBenchError
from hf_optbench.publish.hub import check_hub_online
from hf_optbench.run.lock import RunLock, acquire_run_lock, check_not_busy, is_launch_main_process

# The keys read here; any other is left to parse_args.
PREFLIGHT_KEYS = ("output_dir", "bf16", "fp16", "bf16_full_eval", "fp16_full_eval", "use_cpu", "torch_compile",
                  "num_processes", "tokenizer_name", "push_to_hub", "optimizer", "optimizer_kwargs")
_TRUE = ("yes", "true", "t", "y", "1")  # HfArgumentParser's string_to_bool
DATA_DEFAULTS = {f.name: f.default for f in dataclasses.fields(DataArguments)}
# The keys the size bounds read (config.bounds.check_run_bounds), read here as the keys above are.
BOUND_KEYS = ("max_steps", "logging_steps", "block_size", "data_source", "synthetic_num_tokens", *SYNTHETIC_KEYS)
# Devices on which Accelerate allows fp16 mixed precision (accelerate 1.15, Accelerator.__init__).
FP16_DEVICES = ("xpu", "cuda", "npu", "xla", "mlu", "musa", "hpu", "sdaa", "mps")


def _light_parser(keys: tuple[str, ...] = PREFLIGHT_KEYS) -> argparse.ArgumentParser:
    """argparse for ``keys`` only, with HfArgumentParser's spellings (``--key value``, ``--key=value``,
    ``--key-with-hyphens``, a bare ``--flag`` for true); every other token is left for parse_args."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for key in keys:
        names = [f"--{key}"] + ([f"--{key.replace('_', '-')}"] if "_" in key else [])
        parser.add_argument(*names, dest=key, nargs="?", const="true", default=None)
    return parser


def light_settings(argv: list[str]) -> tuple[dict[str, Any], dict[str, str], dict[str, Any] | None]:
    """({key: value}, {key: where it was set}, the recipe's mapping or None) for :data:`PREFLIGHT_KEYS`, from
    ``[RECIPE] [--key value ...]``.

    As in parse_args, the recipe's values (YAML types, read by the shared loader) are the defaults and the command
    line (strings, last one wins) is parsed on top. A leading token that is not a recipe is left for parse_args to
    refuse.
    """
    recipe_path = argv[0] if argv and argv[0].endswith((".yaml", ".yml", ".json")) else None
    tokens = argv[1:] if recipe_path else list(argv)
    values: dict[str, Any] = {}
    where: dict[str, str] = {}
    recipe = None
    if recipe_path is not None:
        recipe = load_recipe(recipe_path)
        for key in PREFLIGHT_KEYS:
            if recipe.get(key) is not None:
                values[key], where[key] = recipe[key], f"recipe '{recipe_path}'"
    try:
        namespace, _ = _light_parser().parse_known_args(tokens)
    except argparse.ArgumentError:  # a malformed command line: parse_args says what is wrong
        return values, where, recipe
    for key, value in vars(namespace).items():
        if value is not None:
            values[key], where[key] = value, "the command line"
    return values, where, recipe


def bound_settings(argv: list[str], recipe: dict[str, Any] | None) -> dict[str, Any]:
    """The values of :data:`BOUND_KEYS` as parse_args will see them (defaults, the recipe, the command line on top),
    as far as they can be read without it: a command-line value of the wrong type is left out (parse_args refuses
    it), so only values the parser would accept are bounded here."""
    values: dict[str, Any] = {k: v for k, v in DATA_DEFAULTS.items() if k in BOUND_KEYS}
    values.update({k: TRAINING_DEFAULTS[k] for k in BOUND_KEYS if k in TRAINING_DEFAULTS})
    values.update({k: v for k, v in (recipe or {}).items() if k in BOUND_KEYS})
    tokens = argv[1:] if recipe is not None else list(argv)
    try:
        namespace, _ = _light_parser(BOUND_KEYS).parse_known_args(attach_negative_values(tokens))
    except argparse.ArgumentError:
        return values
    for key, text in vars(namespace).items():
        if text is not None:
            kind = str if key == "data_source" else float if key == "logging_steps" else int
            try:
                values[key] = kind(text)
            except ValueError:
                values.pop(key, None)
    return values


def as_bool(value: Any) -> bool:
    """A recipe bool or a command-line string, read as HfArgumentParser reads it."""
    return value if isinstance(value, bool) else str(value).strip().lower() in _TRUE


def _accelerator() -> tuple[str | None, bool]:
    """(this machine's accelerator type or None, whether it computes in bf16), by transformers' own test; without
    importing torch where no GPU is visible (torch's import alone takes seconds, more on a loaded machine)."""
    from hf_optbench.machine import gpu_visible

    if not gpu_visible():
        return None, False
    import torch
    from transformers.utils import is_torch_bf16_gpu_available

    acc = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return (acc.type if acc is not None else None), bool(is_torch_bf16_gpu_available())


def _device_words(kind: str | None) -> str:
    if kind is None:
        return "no GPU"
    if kind == "cuda":
        import torch

        return f"a {torch.cuda.get_device_name(0)}"
    return f"a '{kind}' device"


def check_hardware(values: dict[str, Any], where: dict[str, str]) -> None:
    """Refuse bf16/fp16 that this machine cannot run, naming the hardware they need and the override that runs
    the recipe here. torch and transformers are imported only when a recipe asks for half precision."""
    use_cpu = as_bool(values.get("use_cpu", False))
    bf16 = next((k for k in ("bf16", "bf16_full_eval") if as_bool(values.get(k, False))), None)
    fp16 = next((k for k in ("fp16", "fp16_full_eval") if as_bool(values.get(k, False))), None)
    if bf16 is None and fp16 is None:
        return
    kind, has_bf16 = _accelerator()
    compile_ = as_bool(values.get("torch_compile", False)) and kind is None
    cpu_fix = f"--{bf16 or fp16} false" + (" --torch_compile false" if compile_ else "")
    if bf16 and not use_cpu and not has_bf16:
        fix = "--bf16 false --fp16 true" if kind in FP16_DEVICES else cpu_fix
        raise OptBenchError(
            f"{where[bf16]} sets {bf16} true, for a GPU that computes in bf16 (NVIDIA Ampere or newer: A100, H100, "
            f"L4, RTX 30xx+); this machine has {_device_words(kind)}. Run it here with {fix}"
            + (" (and a smaller model_size; or --use_cpu true to keep bf16, as the CPU's autocast), or use "
               "recipes/quickstart_cpu.yaml." if kind is None else ".")
        )
    if fp16 and (use_cpu or kind not in FP16_DEVICES):
        where_fp16 = where[fp16]
        here = "use_cpu is set" if use_cpu and kind is not None else f"this machine has {_device_words(kind)}"
        raise OptBenchError(
            f"{where_fp16} sets {fp16} true, which needs a GPU (fp16 mixed precision does not run on a CPU); "
            f"{here}. Run it here with {cpu_fix}"
            + (" (and a smaller model_size) or use recipes/quickstart_cpu.yaml." if kind is None else ".")
        )


def explicit_output_dir(values: dict[str, Any]) -> Path | None:
    """The output_dir the recipe or command line names, or None (parse_args then derives one)."""
    value = values.get("output_dir")
    return Path(os.path.expanduser(str(value))) if value not in (None, "") else None


def own_output_dir(cfg: RunConfig, held: RunLock | None = None) -> RunLock | None:
    """The run-directory lock for ``cfg``'s output_dir (main process only; None on the other ranks): ``held`` when
    it already locks that directory, else a new lock (the directory is created). Raises OptBenchError naming the
    holder when another run owns it."""
    out = Path(cfg.training.output_dir)
    if not is_launch_main_process():
        return None
    if held is not None and held.held and held.output_dir.resolve() == out.resolve():
        return held
    return acquire_run_lock(out)


def preflight(argv: list[str]) -> dict[str, Any] | None:
    """Before transformers is imported: refuse an output_dir (named by the recipe or command line) that a live run
    holds, in well under 2 s, half precision this machine cannot run, push_to_hub with the Hub offline, a misspelt
    key, and a tokenizer that cannot be loaded (offline and not cached, custom code). ``validate --full`` runs it
    too. Touches nothing: the lock is taken by
    :func:`own_output_dir` once the arguments are valid. Returns the recipe's mapping (read once: parse_args takes
    it), or None without a recipe."""
    values, where, recipe = light_settings(argv)
    out = explicit_output_dir(values)
    if out is not None:
        check_path_fits(out, "output_dir", RUN_DIR_LONGEST_INSIDE)  # a name too long: refused in well under 1 s
    if out is not None and is_launch_main_process():
        check_not_busy(out)
    bounds = bound_settings(argv, recipe)
    check_run_bounds(bounds)  # absurd sizes and counts, before transformers is imported
    check_hardware(values, where)
    if as_bool(values.get("push_to_hub", False)):
        check_hub_online()  # HF_HUB_OFFLINE: nothing could be uploaded
    if values.get("num_processes") is not None:  # torchrun / accelerate set WORLD_SIZE in every process they start
        recipe_path = argv[0] if recipe is not None else None
        check_num_processes(_int(values["num_processes"]), int(os.environ.get("WORLD_SIZE", "1")), recipe_path)
    recipe_path, cli_tokens = _split_argv(argv)
    check_keys(recipe or {}, cli_tokens, recipe_path)  # a misspelt key is named before what it would have set
    check_light_optimizer_kwargs(values)
    if bounds.get("data_source") != "synthetic":  # offline and not cached, a file, custom code: refused now
        check_tokenizer_available(str(values.get("tokenizer_name") or DATA_DEFAULTS["tokenizer_name"]))
    return recipe


def check_light_optimizer_kwargs(values: dict[str, Any]) -> None:
    """The optimizer_kwargs values that need no optimizer built, refused before torch is imported: Muon's
    ``ns_precision`` (optim.muon.check_ns_precision, the same line the build gives). Read as parse_args reads it
    (config.optim_args.parse_json_mapping); a value that is not a JSON object is left to parse_args, which names it
    in its own order."""
    from hf_optbench.config.optim_args import parse_json_mapping
    from hf_optbench.optim.muon import NS_KEY, check_ns_precision

    raw = values.get("optimizer_kwargs")
    try:
        kwargs = parse_json_mapping("optimizer_kwargs", raw) if isinstance(raw, (str, dict)) else {}
    except OptBenchError:
        return
    if NS_KEY in kwargs and "muon" in str(values.get("optimizer") or "").lower():
        check_ns_precision(kwargs[NS_KEY])


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise OptBenchError(f"num_processes must be an integer, got {value!r}.") from None
