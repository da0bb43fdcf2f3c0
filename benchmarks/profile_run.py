"""What one short run executes of hf_optbench, under cProfile: how many project modules it imports, how many run
code, how many distinct functions run, how often the values a run needs once are derived (the optimizer's name,
the model size, the cited defaults, the recipe read), and whether anything is stamped on the optimizer or the
scheduler the Trainer ran. Issue 30's measure of "one resolved plan per run"; counts, not timings.

    python benchmarks/profile_run.py                       # the quickstart recipe, 5 steps
    python benchmarks/profile_run.py --json -- recipes/quickstart_cpu.yaml --max_steps 5

"Executing" counts the modules of which a function (not only the module body) ran; "functions" counts named code
objects (functions and class bodies), lambdas and comprehensions left out.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DERIVED = ("resolve_optimizer_name", "resolve_size", "size_class", "optimizer_defaults", "cited_defaults",
           "innermost_optimizer", "describe_optimizer", "check_optimizer_kwargs", "load_recipe", "resolve_plan")


def profile(run_args: list[str]) -> dict:
    """Run ``hf-optbench run RUN_ARGS --output_dir <temporary>`` under cProfile and count (see the module doc)."""
    import transformers

    from hf_optbench.cli import main
    from hf_optbench.optim.unwrap import optimizer_chain

    held: dict = {}
    real_train = transformers.Trainer.train

    def train(trainer, *args, **kwargs):
        out = real_train(trainer, *args, **kwargs)
        held.update(optimizer=trainer.optimizer, scheduler=trainer.lr_scheduler)
        return out

    transformers.Trainer.train = train
    package = str(ROOT / "hf_optbench")
    with tempfile.TemporaryDirectory() as tmp:
        prof = cProfile.Profile()
        prof.enable()
        rc = main(["run", *run_args, "--output_dir", str(Path(tmp) / "run")])
        prof.disable()
    transformers.Trainer.train = real_train
    functions, calls = set(), dict.fromkeys(DERIVED, 0)
    for (filename, line, name), (_, ncalls, *_rest) in pstats.Stats(prof).stats.items():
        if filename.startswith(package) and not name.startswith("<"):
            functions.add((filename, line, name))
            if name in calls:
                calls[name] += ncalls
    objects = [*optimizer_chain(held["optimizer"]), held["scheduler"]] if held else []
    return {
        "rc": rc,
        "modules_imported": sum(1 for m in sys.modules if m == "hf_optbench" or m.startswith("hf_optbench.")),
        "modules_executing": len({f for f, _, _ in functions}),
        "functions_run": len(functions),
        "calls": calls,
        "stamped_attributes": sorted({k for o in objects for k in vars(o) if k.startswith("hf_optbench")}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("run_args", nargs="*", help="after --: the run's recipe and arguments")
    ns = parser.parse_args(argv)
    run_args = ns.run_args or [str(ROOT / "recipes" / "quickstart_cpu.yaml"), "--max_steps", "5"]
    result = profile(run_args)
    if ns.json:
        print(json.dumps(result))
    else:
        print(f"modules imported {result['modules_imported']}, executing {result['modules_executing']}, "
              f"functions run {result['functions_run']}; stamped on optimizer/scheduler: "
              f"{result['stamped_attributes'] or 'nothing'}")
        print("calls: " + ", ".join(f"{k} {v}" for k, v in result["calls"].items()))
    return 0 if result["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
