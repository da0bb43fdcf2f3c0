"""What a run checks before transformers is even imported: that its output_dir's names fit the filesystem, that no
other run owns it, that its sizes and counts fit the machine (config.bounds), that the machine has the hardware
the recipe's precision needs, that a recipe recorded by a run on N processes (config.yaml's ``num_processes``)
runs on N, that push_to_hub has a Hub to reach, that every key is known, that every number is one of its type
(``--max_steps ten``), that the values parse_args refuses with no model are refused here, through its own checks
and in its words (a negative or non-finite weight_decay, an init_from directory holding no model, an output_dir
holding another tool's checkpoint or a finished run, DataArguments' own checks), and that the tokenizer can be
loaded (shipped, a local directory without custom code, or a Hub id in the cache when offline: an offline run of
the default Hub tokenizer was refused only after 20 s of imports).

All must answer before ``parse_args`` (which builds ``TrainingArguments``: 5-6 s of imports on a loaded 2-core
machine). A second run into a busy directory is refused in well under 2 s; a bf16 recipe on a machine without a
bf16 GPU gets our one line naming the override, instead of transformers' ``Your setup doesn't support bf16/gpu``
raised inside ``TrainingArguments.__post_init__``; where no GPU is visible at all (``hf_optbench.machine.gpu_visible``:
device files, no CUDA initialisation) it answers without importing torch, also under ``accelerate launch``. The values are read from the recipe and the command line
with the same precedence as :func:`hf_optbench.config.parse.parse_args` (CLI over recipe), for the keys these
checks need, numbers typed as HfArgumentParser types them (:mod:`hf_optbench.config.light_args`); parse_args still
validates everything afterwards, for every caller that has no pre-flight (the Python API, a sweep's validation)."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any

from hf_optbench.config.argv import attach_negative_values
from hf_optbench.config.bounds import check_run_bounds
from hf_optbench.config.checks import (
    RATE_KEYS,
    RUN_DIR_LONGEST_INSIDE,
    check_finite_value,
    check_init_from,
    check_path_fits,
    check_rate,
)
from hf_optbench.config.data_args import DATA_SOURCES, DataArguments
from hf_optbench.config.light_args import TRUE_WORDS, light_parser, number_keys, read_flag, typed_values
from hf_optbench.config.parse import (
    _OWN_DATACLASSES,
    TRAINING_DEFAULTS,
    RunConfig,
    _split_argv,
    check_num_processes,
    check_run_dir,
    default_output_dir,
    load_recipe,
    parse_resume,
    read_keys,
)
from hf_optbench.data.tokenizers import check_tokenizer_available
from hf_optbench.errors import OptBenchError
from hf_optbench.publish.hub import check_hub_online
from hf_optbench.run.lock import RunLock, acquire_run_lock, check_not_busy, is_launch_main_process

# The keys read as written (a bare --flag: true), with where each was set, for the hardware's messages; any other
# key is read typed (:func:`typed_settings`) or left to parse_args.
PREFLIGHT_KEYS = ("output_dir", "bf16", "fp16", "bf16_full_eval", "fp16_full_eval", "use_cpu", "torch_compile",
                  "tokenizer_name", "push_to_hub", "optimizer", "optimizer_kwargs")
DATA_DEFAULTS = {f.name: f.default for f in dataclasses.fields(DataArguments)}
# The keys read typed beside every number (config.light_args.number_keys): the strings and the flag (typed None)
# that the checks of :func:`check_typed_settings` need.
TYPED_KEYS: dict[str, type | None] = {"data_source": str, "data_cache_dir": str, "init_from": str,
                                      "resume_from_checkpoint": str, "overwrite_output_dir": None,
                                      "optimizer": str, "model_size": str}
# Devices on which Accelerate allows fp16 mixed precision (accelerate 1.15, Accelerator.__init__).
FP16_DEVICES = ("xpu", "cuda", "npu", "xla", "mlu", "musa", "hpu", "sdaa", "mps")


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
        namespace, _ = light_parser(dict.fromkeys(PREFLIGHT_KEYS)).parse_known_args(tokens)
    except argparse.ArgumentError:  # a malformed command line: parse_args says what is wrong
        return values, where, recipe
    for key, value in vars(namespace).items():
        if value is not None:
            values[key], where[key] = value, "the command line"
    return values, where, recipe


def typed_settings(argv: list[str], recipe: dict[str, Any] | None) -> tuple[dict[str, Any], set[str]]:
    """(the values of every number key and of :data:`TYPED_KEYS` as parse_args will parse them: its defaults, the
    recipe, the command line on top; the keys the user set). The keys are checked first, as parse_args checks them
    (``config.parse.read_keys``: a misspelt key named before what it would have set), then each value is converted
    with its option's type (``config.light_args``): ``--max_steps ten`` is refused here in parse_args' words."""
    recipe_path, cli_tokens = _split_argv(argv)
    recipe, tokens, explicit, _ = read_keys(recipe or {}, attach_negative_values(cli_tokens), recipe_path)
    keys = {**number_keys(), **TYPED_KEYS}
    values = {f.name: f.default for cls in _OWN_DATACLASSES for f in dataclasses.fields(cls)
              if f.name in keys and f.default is not dataclasses.MISSING}
    values.update({k: v for k, v in TRAINING_DEFAULTS.items() if k in keys})
    values.update(typed_values(recipe, tokens, recipe_path, keys))
    return values, explicit


def check_typed_settings(values: dict[str, Any], explicit: set[str], out: Path | None) -> None:
    """The refusals parse_args makes from these values with no model, data or torch, through its own code and in
    its order: DataArguments' own checks (and an entry the cache's disk cannot hold: for a text source, one larger
    than the whole disk, which cannot be cached already), a non-finite rate, a local init_from that is no model, a negative rate,
    and an explicit output_dir whose contents a run may not write over (another tool's checkpoint, a finished
    run...: ``config.parse.check_run_dir``)."""
    source = values.get("data_source")
    if source in DATA_SOURCES and source != "local":  # local needs data_files, left to parse_args
        fields = {f.name for f in dataclasses.fields(DataArguments)}
        data_args = DataArguments(**{k: v for k, v in values.items() if k in fields})
        from hf_optbench.data.pipeline import check_synthetic_room, check_text_room

        # an entry too large for the cache's disk: refused from the settings alone
        (check_synthetic_room if source == "synthetic" else check_text_room)(data_args)
    rates = [k for k in RATE_KEYS if k in explicit and k in values]
    for key in rates:
        check_finite_value(key, values[key])
    if values.get("init_from"):
        check_init_from(str(values["init_from"]))
    for key in rates:
        check_rate(key, values[key])
    overwrite = read_flag(values.get("overwrite_output_dir", False))
    if out is not None and overwrite is not None:  # a spelling string_to_bool refuses: parse_args names it
        check_run_dir(out, parse_resume(values.get("resume_from_checkpoint")), overwrite)


def as_bool(value: Any) -> bool:
    """A recipe bool or a command-line string, read as HfArgumentParser reads it."""
    return value if isinstance(value, bool) else str(value).strip().lower() in TRUE_WORDS


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


def derived_output_dir(typed: dict[str, Any]) -> Path | None:
    """The output_dir parse_args derives when none is named (``config.parse.default_output_dir``), from the typed
    settings; the seed's default is TrainingArguments' own, read from transformers' source. None where a value is
    not known here (parse_args then refuses or derives it)."""
    from hf_optbench.config.help import training_fields_help

    seed = typed.get("seed")
    if seed is None:
        seed = training_fields_help(("seed",)).get("seed", (None, ""))[0]
    optimizer, size = typed.get("optimizer"), typed.get("model_size")
    if not isinstance(seed, int) or not isinstance(optimizer, str) or not isinstance(size, str):
        return None
    return default_output_dir(optimizer, size, seed)


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
    holds, in well under 2 s, a misspelt key, a value of the wrong type, absurd sizes, half precision this machine
    cannot run, push_to_hub with the Hub offline, what parse_args refuses of the values read here
    (:func:`check_typed_settings`: a rate, init_from, what output_dir holds) and a tokenizer that cannot be loaded
    (offline and not cached, custom code). ``validate --full`` runs it too. Touches nothing: the lock is taken by
    :func:`own_output_dir` once the arguments are valid. Returns the recipe's mapping (read once: parse_args takes
    it), or None without a recipe."""
    values, where, recipe = light_settings(argv)
    out = explicit_output_dir(values)
    if out is not None:
        check_path_fits(out, "output_dir", RUN_DIR_LONGEST_INSIDE)  # a name too long: refused in well under 1 s
    if out is not None and is_launch_main_process():
        check_not_busy(out)
    typed, explicit = typed_settings(argv, recipe)
    check_run_bounds(typed)  # absurd sizes and counts, before transformers is imported
    check_hardware(values, where)
    if as_bool(values.get("push_to_hub", False)):
        check_hub_online()  # HF_HUB_OFFLINE: nothing could be uploaded
    if typed.get("num_processes") is not None:  # torchrun / accelerate set WORLD_SIZE in every process they start
        recipe_path = argv[0] if recipe is not None else None
        check_num_processes(typed["num_processes"], int(os.environ.get("WORLD_SIZE", "1")), recipe_path)
    check_light_optimizer_kwargs(values)
    if out is None:  # the directory parse_args will derive: a live run in it, or its finished results, refused now
        out = derived_output_dir(typed)
        if out is not None and is_launch_main_process():
            check_not_busy(out)
    check_typed_settings(typed, explicit, out)
    if typed.get("data_source") != "synthetic":  # offline and not cached, a file, custom code: refused now
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
