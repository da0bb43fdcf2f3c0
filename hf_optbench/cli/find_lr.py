"""``hf-optbench find-lr RECIPE.yaml``: the LR range test (:func:`hf_optbench.run.lr_finder.lr_range_test`) on the
model, data, optimizer, micro-batch, accumulation and clipping a run of that recipe would use.

It writes only its own folder (``--output``, default ``<output_dir>/lr_finder``), so it runs beside a finished run
of the same recipe and never touches that run's files; it refuses to replace an earlier ``lr_finder.json`` unless
``--overwrite`` is given. Progress goes to stderr: a line every 10 steps or 5 seconds (step, lr, loss, smoothed)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hf_optbench.cli import wrap_help
from hf_optbench.cli.flags import canonical_flags
from hf_optbench.config.argv import help_requested, recipe_first
from hf_optbench.errors import OptBenchError

_OWN_OPTIONS = {"--min_lr": float, "--max_lr": float, "--num_steps": int, "--output": str, "--smooth": float,
                "--diverge_factor": float}  # the hyphen spellings (--num-steps) work too (hf_optbench.cli.flags)
_OWN_FLAGS = {"--overwrite"}
_OUTPUT_FILES = ("lr_finder.json", "lr_finder.png")
PROGRESS_EVERY_STEPS = 10
PROGRESS_EVERY_SECONDS = 5.0

_USAGE = wrap_help("""usage: hf-optbench find-lr RECIPE.yaml [--key value ...] [--min_lr 1e-7] [--max_lr 1]
                           [--num_steps 100] [--output DIR] [--overwrite] [--smooth 0.98]
                           [--diverge_factor 4]

LR range test on the recipe's model, data, optimizer, micro-batch, accumulation and clipping: the learning rate
grows geometrically from min_lr to max_lr, one step each. Writes DIR/lr_finder.json and DIR/lr_finder.png (a
finished run in the recipe's output_dir is left as it is) and prints three suggestions: valley (fastai's
default), steepest descent before the minimum, and minimum/10. Progress lines go to stderr. The recipe may also
come as --config RECIPE.yaml, anywhere on the line; --key value overrides it as in `hf-optbench run`.

options:
  --min_lr 1e-7        the first learning rate of the range
  --max_lr 1           the last learning rate of the range
  --num_steps 100      steps (learning rates) in the range
  --output DIR         where the results go (default: <output_dir>/lr_finder)
  --overwrite          replace an earlier lr_finder.json in DIR
  --smooth 0.98        beta of the loss's bias-corrected moving average (fastai's Recorder)
  --diverge_factor 4   stop once the smoothed loss exceeds this many times its best
                       (fastai, Lightning)""")


def _split_own(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Our --min_lr/--max_lr/... out of argv; the rest (recipe and --key value) goes to config.parse_args."""
    own: dict[str, Any] = {}
    rest: list[str] = []
    argv = canonical_flags(argv, [*_OWN_OPTIONS, *_OWN_FLAGS])
    it = iter(range(len(argv)))
    for i in it:
        tok = argv[i]
        key, eq, val = tok.partition("=")
        if tok in _OWN_FLAGS:
            own[tok[2:]] = True
        elif key in _OWN_OPTIONS:
            if not eq:
                if i + 1 >= len(argv):
                    raise OptBenchError(f"{key} needs a value.")
                val = argv[i + 1]
                next(it, None)
            try:
                own[key[2:].replace("-", "_")] = _OWN_OPTIONS[key](val)
            except ValueError as exc:
                raise OptBenchError(f"{key} {val!r}: not a valid {_OWN_OPTIONS[key].__name__}.") from exc
        else:
            rest.append(tok)
    return own, rest


def _check_own(own: dict[str, Any]) -> None:
    """The range test's own options, checked before the data and model are built."""
    import math

    for key, value in own.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise OptBenchError(f"--{key} must be a finite number, got {value}.")
    min_lr, max_lr = own.get("min_lr", 1e-7), own.get("max_lr", 1.0)
    if not 0 < min_lr < max_lr:
        raise OptBenchError(f"--min_lr {min_lr:g} and --max_lr {max_lr:g}: need 0 < min_lr < max_lr (e.g. --min_lr "
                            "1e-7 --max_lr 1).")
    if own.get("num_steps", 100) < 2:
        raise OptBenchError(f"--num_steps must be >= 2, got {own['num_steps']} (default 100).")
    if not 0 <= own.get("smooth", 0.98) < 1:
        raise OptBenchError(f"--smooth must be in [0, 1), got {own['smooth']} (default 0.98).")
    if not own.get("diverge_factor", 4.0) > 1:
        raise OptBenchError(f"--diverge_factor must be > 1, got {own['diverge_factor']} (default 4).")


class _Progress:
    """``on_step`` for the range test: one stderr line every PROGRESS_EVERY_STEPS steps or PROGRESS_EVERY_SECONDS
    seconds, whichever comes first, and at the last step, so a long test is never silent."""

    def __init__(self, num_steps: int, stream: Any = None) -> None:
        import time

        self.num_steps, self.stream, self.clock = num_steps, stream or sys.stderr, time.monotonic
        self.start = self.last = self.clock()

    def __call__(self, step: int, lr: float, loss: float, smoothed: float) -> None:
        now = self.clock()
        if step % PROGRESS_EVERY_STEPS and now - self.last < PROGRESS_EVERY_SECONDS and step + 1 < self.num_steps:
            return
        self.last = now
        print(f"find-lr step {step + 1:>4}/{self.num_steps}  lr {lr:.2e}  loss {loss:.4f}  smoothed {smoothed:.4f}"
              f"  ({now - self.start:.0f} s)", file=self.stream, flush=True)


def _range_test(plan: Any, own: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(LRFinderResult, the optimizer it stepped, the model) on the recipe's model and a seeded, shuffled train loader."""
    import torch
    from torch.utils.data import DataLoader

    from hf_optbench.optim.registry import build_resolved
    from hf_optbench.run.lr_finder import lr_range_test
    from hf_optbench.run.train import prepare

    cfg = plan.args
    targs = cfg.training
    print(f"find-lr: building the data and the {cfg.model.model_size} model of {cfg.recipe_path or 'the defaults'}",
          file=sys.stderr, flush=True)
    prepared = prepare(plan)
    model = prepared.model.to(targs.device)
    min_lr = own.get("min_lr", 1e-7)
    opt, _ = build_resolved(plan.optimizer.spec or plan.optimizer.name, model, lr=min_lr,
                            weight_decay=plan.optimizer.weight_decay.value, ctor=plan.optimizer.constructor_values(),
                            embedding_state_32bit=plan.optimizer.embedding_state_32bit)
    gen = torch.Generator().manual_seed(targs.seed)
    loader = DataLoader(prepared.train_dataset, batch_size=targs.per_device_train_batch_size, shuffle=True,
                        collate_fn=prepared.data_collator, generator=gen, drop_last=True)
    dtype = torch.bfloat16 if targs.bf16 else torch.float16 if targs.fp16 else None
    num_steps = own.get("num_steps", 100)
    print(f"find-lr: {cfg.optim.optimizer}, lr {min_lr:.0e} -> {own.get('max_lr', 1.0):.0e} over {num_steps} steps "
          "(stops early once the smoothed loss exceeds --diverge_factor x its best)", file=sys.stderr, flush=True)
    result = lr_range_test(
        model, opt, loader, min_lr=min_lr, max_lr=own.get("max_lr", 1.0), num_steps=num_steps,
        smooth=own.get("smooth", 0.98), diverge_factor=own.get("diverge_factor", 4.0),
        accumulation_steps=targs.gradient_accumulation_steps, max_grad_norm=plan.max_grad_norm.value or None,
        autocast_dtype=dtype, restore=False, on_step=_Progress(num_steps),
    )
    return result, opt, model


def _record(plan: Any, result: Any, opt: Any, model: Any) -> dict[str, Any]:
    """lr_finder.json: the curve and suggestions, with what they were measured on."""
    from hf_optbench.optim.registry import describe_optimizer

    cfg = plan.args
    targs = cfg.training
    hparams = plan.hyperparameters()
    return {"optimizer": cfg.optim.optimizer, "optimizer_impl": describe_optimizer(opt, model=model),
            "model_size": cfg.model.model_size, "recipe": cfg.recipe_path,
            "micro_batch_size": targs.per_device_train_batch_size,
            "gradient_accumulation_steps": targs.gradient_accumulation_steps,
            "hyperparameter_sources": {k: v["source"] for k, v in hparams.items()
                                       if k in ("weight_decay", "max_grad_norm")},
            "default_learning_rate": hparams.get("learning_rate", {}).get("value"),
            **result.to_dict()}


def _fmt(v: float | None) -> str:
    return f"{v:.3g}" if v is not None else "n/a"


def _output_dir(cfg: Any, own: dict[str, Any]) -> Path:
    """Our own folder, writable, and holding no earlier result unless --overwrite (checked before any work)."""
    from hf_optbench.config.checks import check_writable_dir

    out = Path(own.get("output") or Path(cfg.training.output_dir) / "lr_finder")
    check_writable_dir(out, "--output")
    earlier = [name for name in _OUTPUT_FILES if (out / name).exists()]
    if earlier and not own.get("overwrite"):
        raise OptBenchError(f"'{out}' already holds {' and '.join(earlier)} from an earlier range test. Pass "
                            "--overwrite to replace it, or choose another --output DIR.")
    return out


def _parse(rest: list[str]) -> Any:
    """The recipe as a run would read it, minus the run's output_dir check: find-lr writes only its own folder,
    so a finished (or unfinished) run in output_dir is no reason to stop, and is never touched."""
    from hf_optbench.config.parse import parse_args

    # parse_args refuses an output_dir holding a finished run unless --overwrite_output_dir true; that flag only
    # matters to a run's clean-up (run.output.prepare_output_dir), which find-lr never calls.
    return parse_args([*rest, "--overwrite_output_dir", "true"])


def main(argv: list[str] | None = None) -> int:
    """Run the range test for a recipe, write ``lr_finder.json`` and ``lr_finder.png``, print the suggestions."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or help_requested(argv):
        print(_USAGE)
        return 0 if argv else 2
    own, rest = _split_own(recipe_first(argv))
    _check_own(own)
    from hf_optbench.run.plan import resolve_plan
    from hf_optbench.rundir import write_json_atomic

    cfg = _parse(rest)
    plan = resolve_plan(cfg)  # weight decay / clipping / constructor values as the run would use them
    out = _output_dir(cfg, own)
    result, opt, model = _range_test(plan, own)
    out.mkdir(parents=True, exist_ok=True)
    record = _record(plan, result, opt, model)
    write_json_atomic(out / "lr_finder.json", record)
    png = result.plot(out / "lr_finder.png", title=f"LR range test: {cfg.optim.optimizer}, {cfg.model.model_size}")
    stop = f", stopped at step {result.diverged_at_step + 1}" if result.diverged_at_step is not None else ""
    print(f"suggested learning rates: valley {_fmt(result.suggestion_valley)}   steepest descent "
          f"{_fmt(result.suggestion_steepest)}   min/10 {_fmt(result.suggestion_min_div10)}   (loss lowest at "
          f"{_fmt(result.minimum_lr)}; registry default {_fmt(record['default_learning_rate'])}; "
          f"{len(result.lrs)} steps{stop})")
    print(f"wrote {out / 'lr_finder.json'} and {png}")
    return 0
