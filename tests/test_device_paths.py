"""The per-device choice of computation path (core/device_paths.py): each path where it was measured faster,
the plain reference paths where nothing was measured, an explicit setting always wins. The two paths' equal
numbers are tested where they run: tests/test_trainer.py (training, incl. the default) and
tests/test_sampling_prefix.py (sampling)."""

from __future__ import annotations

import pytest

from spogw_dagster.core.device_paths import MEASURED, paths_for, prefix_sharing_for, shared_prompt_for


def test_each_device_gets_the_path_it_measured_faster():
    # CPU: training 2.96x and sampling 1.72x for the shared paths; H200: 0.76x and 0.84x, so the plain paths
    assert shared_prompt_for("cpu") is True and prefix_sharing_for("cpu") is True
    assert shared_prompt_for("cuda") is False and prefix_sharing_for("cuda") is False
    assert shared_prompt_for("cuda:1") is False  # a device index does not change the type
    assert (MEASURED["cpu"].train_ratio, MEASURED["cuda"].sample_ratio) == (2.96, 0.84)


def test_an_unmeasured_device_gets_the_reference_paths_and_a_setting_wins():
    assert paths_for("mps") is None
    assert shared_prompt_for("mps") is False and prefix_sharing_for("xpu") is False
    for device in ("cpu", "cuda", "mps"):
        assert shared_prompt_for(device, True) is True and shared_prompt_for(device, False) is False
        assert prefix_sharing_for(device, True) is True and prefix_sharing_for(device, False) is False


def test_the_training_config_takes_none_and_refuses_anything_else():
    from spogw_dagster.core.hyperparams import ConfigError
    from spogw_dagster.core.training import TrainConfig

    assert TrainConfig().shared_prompt is None
    with pytest.raises(ConfigError, match="shared_prompt"):
        TrainConfig(shared_prompt="yes")  # type: ignore[arg-type]


def test_the_path_changes_no_config_hash_and_reaches_the_assets(tmp_path):
    from spogw_dagster.pipeline.defs.resources import PipelineResource
    from spogw_dagster.pipeline.settings import load_config

    base = load_config("tiny")
    for v in (True, False):
        other = load_config("tiny", overrides={"training": {"shared_prompt": v}})
        assert other.hash == base.hash and other.training.core(0.5).shared_prompt is v
        # the assets read the config from the resource's JSON: a forced path must survive it
        seen = PipelineResource.from_config(other, tmp_path).config()
        assert seen.training.shared_prompt is v and seen.train_config().shared_prompt is v


def test_a_run_that_took_either_path_is_the_same_run():
    # a finished run's stats record the path it took (True on the CPU); the config asking for None is that run
    # (the comparison reuses the loop's checkpoint on this: comparison_methods.trained_the_same)
    from spogw_dagster.core.training import TrainConfig, config_identity

    asked = TrainConfig(seed=3)
    recorded = {**asked.to_dict(), "shared_prompt": True}
    assert config_identity(recorded) == asked.identity()
    assert config_identity({**recorded, "seed": 4}) != asked.identity()  # anything else still tells runs apart


def test_native_bfloat16_is_read_from_the_cpu_flags():
    from spogw_dagster.core.device_paths import cpu_features

    epyc = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_vnni\nbugs\t\t: amx_bf16\n"
    assert cpu_features(epyc) == {"avx512_bf16": True, "amx_bf16": False}  # only the flags line counts
    sapphire = "flags\t\t: avx512f amx_tile amx_bf16 amx_int8\n"
    assert cpu_features(sapphire) == {"avx512_bf16": False, "amx_bf16": True}
    assert cpu_features("flags\t\t: sse avx2\n") == {"avx512_bf16": False, "amx_bf16": False}
    assert cpu_features("") == {"avx512_bf16": False, "amx_bf16": False}  # no /proc/cpuinfo: nothing native


def test_auto_takes_bfloat16_only_where_it_is_native_and_measured_faster(monkeypatch):
    from spogw_dagster.core import device_paths as dp

    native, none = {"avx512_bf16": True, "amx_bf16": False}, {"avx512_bf16": False, "amx_bf16": False}
    amx = {"avx512_bf16": False, "amx_bf16": True}
    monkeypatch.setitem(dp.BF16_MEASURED, "cpu", dp.DtypeChoice(2.3, 1.8, "by hand"))
    assert dp.dtype_for("cpu", "auto", native) == "bfloat16" and dp.dtype_for("cpu", "auto", amx) == "bfloat16"
    assert dp.dtype_for("cpu", "auto", none) == "float32"  # emulated bfloat16 is slow: float32
    assert dp.dtype_for("cuda:0", "auto") == "bfloat16" and dp.dtype_for("cuda", "auto", cuda_bf16=False) == "float32"
    assert dp.dtype_for("mps", "auto", native) == "float32"  # nothing measured there
    for setting in ("float32", "bfloat16", "float16"):  # a setting wins
        assert dp.dtype_for("cpu", setting, none) == setting
    # measured slower for training on this CPU: float32, though sampling gained
    monkeypatch.setitem(dp.BF16_MEASURED, "cpu", dp.DtypeChoice(2.3, 0.9, "by hand"))
    assert dp.dtype_for("cpu", "auto", native) == "float32"
    monkeypatch.delitem(dp.BF16_MEASURED, "cpu")
    assert dp.dtype_for("cpu", "auto", native) == "float32"


def test_the_loader_and_the_configs_take_auto():
    from spogw_dagster.core.device_paths import dtype_for
    from spogw_dagster.core.training import TrainConfig
    from spogw_dagster.models import resolve_dtype
    from spogw_dagster.pipeline.settings import load_config

    assert resolve_dtype("float32", "cpu") == "float32"
    assert resolve_dtype("auto", "cpu") == dtype_for("cpu", "auto")  # this machine's CPU flags decide
    assert TrainConfig(dtype="auto").dtype == "auto"
    cfg = load_config("tiny", overrides={"generator": {"dtype": "auto"}})
    assert cfg.train_config().dtype == "auto" and cfg.hash != load_config("tiny").hash
