"""Every accelerate config loads with accelerate's own loader, and `accelerate launch` derives from it the launcher,
process count and precision that accelerate_configs/README.md promises (checked without launching anything)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

CONFIG_DIR = Path(__file__).resolve().parents[1] / "accelerate_configs"
CONFIGS = sorted(p.name for p in CONFIG_DIR.glob("*.yaml"))

# file -> (launcher accelerate picks, processes in total, mixed precision, ZeRO stage or None)
EXPECTED = {
    "cpu.yaml": ("simple", 1, "no", None),
    "cpu_ddp2.yaml": ("torchrun", 2, "no", None),
    "cpu_zero2.yaml": ("deepspeed", 2, "no", 2),
    "t4_single.yaml": ("simple", 1, "fp16", None),
    "t4x2_ddp.yaml": ("torchrun", 2, "fp16", None),
    "a100x4_ddp.yaml": ("torchrun", 4, "bf16", None),
    "a100x4_zero2.yaml": ("deepspeed", 4, "bf16", 2),
    "a100x4_zero3.yaml": ("deepspeed", 4, "bf16", 3),
    "multinode_2x_a100x4_ddp.example.yaml": ("torchrun", 8, "bf16", None),
}
PRECISION_WORDS = {"no": "fp32", "fp16": "fp16", "bf16": "bf16"}


def launch_plan(config_file: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """What `accelerate launch --config_file F -m hf_optbench.run r.yaml` would do, up to starting processes.

    Mirrors the branch choice of accelerate.commands.launch.launch_command (accelerate 1.15) and calls the same
    env-preparing functions, so a config accelerate would misread fails here rather than on a rented cluster.
    """
    import accelerate.utils.launch as acc_launch
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    # the multi-node example names a fixed port; whether this test machine uses it is irrelevant here
    monkeypatch.setattr(acc_launch, "is_port_in_use", lambda port: False)
    args = launch_command_parser().parse_args(["--config_file", str(config_file), "-m", "hf_optbench.run", "r.yaml"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    if args.use_deepspeed and not args.cpu:
        fields = list(defaults.deepspeed_config.keys()) + (["mixed_precision"] if mp_from_config else [])
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        _, env = acc_launch.prepare_deepspeed_cmd_env(args)
        launcher, per_node = "deepspeed", args.num_processes // args.num_machines
    elif args.multi_gpu and not args.cpu:
        env = acc_launch.prepare_multi_gpu_env(args)
        launcher, per_node = "torchrun", int(args.nproc_per_node)
    else:
        _, env = acc_launch.prepare_simple_launcher_cmd_env(args)
        launcher, per_node = "simple", 1  # one process, whatever num_processes says
    return {"launcher": launcher, "processes": per_node * args.num_machines, "env": env, "defaults": defaults,
            "args": args}


def test_every_config_is_listed() -> None:
    assert set(CONFIGS) == set(EXPECTED), "add new accelerate configs to EXPECTED and to the README table"


@pytest.mark.parametrize("name", CONFIGS)
def test_config_loads_with_accelerates_loader(name: str) -> None:
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file

    cfg = load_config_from_file(str(CONFIG_DIR / name))
    assert isinstance(cfg, ClusterConfig)
    assert cfg.compute_environment.value == "LOCAL_MACHINE"
    assert cfg.dynamo_config == {}  # torch.compile stays a recipe choice (TrainingArguments.torch_compile)


@pytest.mark.parametrize("name", CONFIGS)
def test_launch_plan_matches_expectation(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    launcher, processes, precision, zero_stage = EXPECTED[name]
    plan = launch_plan(CONFIG_DIR / name, monkeypatch)
    assert plan["launcher"] == launcher
    assert plan["processes"] == processes
    assert plan["env"]["ACCELERATE_MIXED_PRECISION"] == precision
    if zero_stage is None:
        assert plan["env"].get("ACCELERATE_USE_DEEPSPEED", "false") == "false"
    else:
        assert plan["env"]["ACCELERATE_USE_DEEPSPEED"] == "true"
        assert int(plan["env"]["ACCELERATE_DEEPSPEED_ZERO_STAGE"]) == zero_stage


def test_t4_never_bf16_and_a100_always_bf16() -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    for name in CONFIGS:
        mp = load_config_from_file(str(CONFIG_DIR / name)).mixed_precision
        if name.startswith("t4"):
            assert mp == "fp16", f"{name}: the T4 has no bf16"
        if "a100" in name:
            assert mp == "bf16", f"{name}: A100 runs use bf16"


def test_cpu_ddp2_uses_the_variant_that_starts_two_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """MULTI_CPU (or --cpu) goes through the simple launcher, which starts ONE process: the file must not."""
    plan = launch_plan(CONFIG_DIR / "cpu_ddp2.yaml", monkeypatch)
    assert plan["defaults"].distributed_type.value == "MULTI_GPU"
    assert plan["launcher"] == "torchrun" and plan["args"].nproc_per_node == "2"
    assert plan["args"].main_process_port != 0, "port 0 must be resolved to a free port by accelerate"


@pytest.mark.parametrize("name", [n for n in CONFIGS if EXPECTED[n][3] is not None])
def test_deepspeed_config_keeps_our_optimizer(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The DeepSpeed config accelerate builds from the file has no optimizer/scheduler section (so DeepSpeed
    wraps hf_optbench's optimizer), no CPU offload (which would swap in DeepSpeedCPUAdam), "auto" batch/clipping
    (filled from TrainingArguments), and the file's precision."""
    from accelerate.utils import DeepSpeedPlugin

    plan = launch_plan(CONFIG_DIR / name, monkeypatch)
    for key, value in plan["env"].items():
        if key.startswith("ACCELERATE_"):
            monkeypatch.setenv(key, value)
    plugin = DeepSpeedPlugin()
    plugin.set_mixed_precision(plan["env"]["ACCELERATE_MIXED_PRECISION"])
    ds = plugin.deepspeed_config
    assert "optimizer" not in ds and "scheduler" not in ds
    zero = ds["zero_optimization"]
    assert zero["stage"] == EXPECTED[name][3]
    assert zero["offload_optimizer"]["device"] == "none" and zero["offload_param"]["device"] == "none"
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping"):
        assert ds[key] == "auto", f"{key} must come from the recipe, not the hardware file"
    precision = EXPECTED[name][2]
    assert ds["bf16"]["enabled"] is (precision == "bf16")
    assert ds["fp16"]["enabled"] is (precision == "fp16")


def _readme_rows() -> dict[str, dict[str, str]]:
    text = (CONFIG_DIR / "README.md").read_text(encoding="utf-8")
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`") and cells[0].endswith(".yaml`"):
            rows[cells[0].strip("`")] = dict(zip(("file", "hardware", "precision", "processes", "command"), cells, strict=True))
    return rows


def test_readme_table_matches_the_files() -> None:
    rows = _readme_rows()
    assert set(rows) == set(CONFIGS), "accelerate_configs/README.md must have one row per config file"
    for name, (_, processes, precision, _) in EXPECTED.items():
        row = rows[name]
        assert row["precision"] == PRECISION_WORDS[precision], name
        assert int(re.match(r"\d+", row["processes"]).group()) == processes, name
        assert f"--config_file accelerate_configs/{name}" in row["command"], name
        assert "-m hf_optbench.run recipes/" in row["command"], name


def test_readme_commands_name_existing_recipes() -> None:
    root = CONFIG_DIR.parent
    for row in _readme_rows().values():
        recipe = re.search(r"(recipes/\S+\.yaml)", row["command"]).group(1)
        assert (root / recipe).is_file(), f"{row['file']}: README names missing {recipe}"
