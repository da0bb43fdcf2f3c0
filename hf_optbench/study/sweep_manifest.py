"""What a sweep writes about itself before its runs: ``sweep_manifest.json`` (every run's matrix point and
arguments, the launcher, the tune section, the sweep's identity) and a copy of the sweep file, with no secret value
in either. The report and ``hf-optbench tune`` read the manifest; a restart keeps its sweep id."""

from __future__ import annotations

import uuid
from dataclasses import asdict
from typing import Any

from hf_optbench.publish.redact import (
    REDACTED,
    argv_secret_values,
    public_env,
    redact_argv,
    scrub_secrets,
    secret_values,
)
from hf_optbench.rundir import MANIFEST_FILE, SWEEP_COPY_FILE, write_json_atomic, write_text_atomic
from hf_optbench.study.kept_runs import kept_entries
from hf_optbench.study.sweep_spec import SweepSpec
from hf_optbench.study.sweep_state import sweep_identity


def _redacted_copy(spec: SweepSpec, secrets: list[str]) -> str:
    """The sweep file's text with every secret value replaced (comments kept); when that does not read back as
    YAML free of them (a value written quoted or escaped), the parsed file re-dumped with the values replaced."""
    import yaml

    from hf_optbench.yaml_file import dump_yaml

    original = spec.path.read_text(encoding="utf-8")
    text = original
    for value in sorted(secrets, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    try:
        raw = yaml.safe_load(text) or {}
        env = (raw.get("launcher") or {}).get("env") or {}
        command = [str(c) for c in (raw.get("launcher") or {}).get("command") or []]
        clean = not any(str(v) in secrets for v in env.values()) and redact_argv(command) == command
    except (yaml.YAMLError, AttributeError):
        clean = False
    if not clean:
        raw = yaml.safe_load(original) or {}
        launcher = {**raw["launcher"], "env": public_env(dict(raw["launcher"].get("env") or {}))}
        if isinstance(launcher.get("command"), list):
            launcher["command"] = redact_argv(launcher["command"])
        text = "# secrets removed by hf-optbench\n" + dump_yaml({**raw, "launcher": launcher}, sort_keys=False)
    return str(scrub_secrets(text))


def manifest(spec: SweepSpec, kept: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The manifest of one phase: secret-named env values replaced by a marker, token-shaped strings removed.
    ``kept``: the entries of runs kept from earlier invocations, which say what those runs ran with."""
    launcher = {k: redact_argv(v) if k == "command" and isinstance(v, list) else v
                for k, v in spec.launcher.items() if k != "env"}
    runs = []
    for r in spec.runs:
        d = (kept or {}).get(r.run_id) or asdict(r)
        d["env"] = public_env(d.get("env") or {})
        runs.append(d)
    out = scrub_secrets({
        "name": spec.name, "sweep_file": str(spec.path), "base": str(spec.base), "launcher": launcher,
        "overrides": spec.overrides, "per_optimizer": spec.per_optimizer, "per_model_size": spec.per_model_size,
        "report": spec.report.as_dict(), "runs": runs})
    out["launcher"]["env"] = public_env(dict(spec.launcher.get("env") or {}))
    if spec.tune is not None and spec.tuning is not None:
        out["tune"] = {**asdict(spec.tune), "tuning_dir": str(spec.tuning.output_dir),
                       "tuned_file": str(spec.tuned_file) if spec.budget is None or len(spec.budget.ratios) < 2
                       else [str(spec.tuned_file_for(k)) for k in spec.budget.keys]}
    return out


def write_manifest(spec: SweepSpec, sweep_copy: bool = True, relaunch: set[str] | None = None) -> None:
    """The matrix point and arguments of every run (the report and `tune` read it: a run kept from an earlier
    invocation keeps its entry, a run in ``relaunch`` gets the file's current one) and a copy of the sweep file;
    no secret value in either."""
    spec.runs_dir.mkdir(parents=True, exist_ok=True)
    out = manifest(spec, kept_entries(spec, relaunch or set()))
    # the sweep's identity, kept across restarts: start rows carry it, so only this sweep's processes are stopped
    out["sweep_id"] = sweep_identity(spec.output_dir)["sweep_id"] or uuid.uuid4().hex
    write_json_atomic(spec.output_dir / MANIFEST_FILE, out)
    if sweep_copy:
        secrets = secret_values(dict(spec.launcher.get("env") or {})) \
            + argv_secret_values(list(spec.launcher.get("command") or []))
        write_text_atomic(spec.output_dir / SWEEP_COPY_FILE, _redacted_copy(spec, secrets))
