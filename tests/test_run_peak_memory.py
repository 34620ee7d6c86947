"""`spogw run`'s peak-memory line: the highest of the steps' own peaks (`peak_rss_mb`), since each step resets the
kernel's high-water mark and a timer around the run sees only the last step's."""

from spogw_dagster.pipeline.runs.loop import IterationOutcome, peak_sentence


def test_the_run_peak_is_the_highest_step_peak_of_any_iteration():
    # the answers profile's shape: training peaks far above the report that runs last
    it0 = IterationOutcome("0000", "ok", asset_peak_mb={"sampled_workflows": 3189.7, "lora_checkpoint": 10216.7,
                                                        "benchmark_report": 3265.3})
    it1 = IterationOutcome("0001", "ok", asset_peak_mb={"lora_checkpoint": 9000.0, "benchmark_report": 3300.0})
    assert it0.peak() == ("lora_checkpoint", 10216.7)
    said = peak_sentence([IterationOutcome("0002", "skipped"), it1, it0])
    assert said.startswith("peak memory of this process: 10.0 GiB, in lora_checkpoint[0000]")  # 10216.7 / 1024
    assert "last step" in said


def test_no_step_ran_no_peak_line():
    assert peak_sentence([IterationOutcome("0000", "skipped")]) is None
    assert IterationOutcome("0000", "ok").peak() is None
