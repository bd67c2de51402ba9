"""perf/gpu/gpu_summary.py, which sums up perf/gpu_validate.sh's run from the files it left."""

from __future__ import annotations

import json

from perf.gpu.gpu_summary import junit_counts, summarize

_JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="1"
skipped="1" tests="5"><testcase classname="tests.test_gpu" name="test_a"/><testcase classname="tests.test_gpu"
name="test_b"><failure message="boom"/></testcase><testcase classname="tests.test_gpu" name="test_c"><error
message="setup"/></testcase><testcase classname="tests.test_gpu" name="test_d"><skipped/></testcase><testcase
classname="tests.test_gpu" name="test_e"/></testsuite></testsuites>"""


def test_the_shards_junit_files_are_summed_and_failures_named(tmp_path) -> None:
    for k in range(2):
        (tmp_path / f"gpu_tests_h100_shard{k}.xml").write_text(_JUNIT)
    (tmp_path / "gpu_tests_h100_shard2.xml").write_text("<testsuites><testsuite")  # cut by its budget
    paths = sorted(str(p) for p in tmp_path.glob("*.xml"))
    t = junit_counts(paths)
    assert (t["tests"], t["passed"], t["failures"], t["errors"], t["skipped"]) == (10, 4, 2, 2, 2)
    assert t["failed"] == ["tests.test_gpu::test_b", "tests.test_gpu::test_c"] * 2
    assert len(t["unreadable"]) == 1


def test_a_run_cut_short_says_what_is_missing(tmp_path) -> None:
    (tmp_path / "steps.txt").write_text("tests: exit 124, 120s of 120s, log gpu_tests_h100.txt\n")
    rows = [{"model": "llama-tiny", "eager_ms": 2.0, "inductor_ms": 1.0, "inductor_ro_ms": 0.2, "fuseg_graphs_ms": 0.3,
             "fuseg_graphs_vs_inductor": 0.3, "fuseg_graphs_vs_inductor_ro": 1.5,
             "fuseg_graphs_programs": [{"refused": None, "counts": {"replayed": 118}, "last_fallback": None}]}]
    (tmp_path / "gpu_compiled_h100.json").write_text(json.dumps(
        {"command": "python -m perf.compiled", "models_asked": ["llama-tiny", "vit"], "rows": rows,
         "summary": {"all": {"fuseg_graphs_above_1.1x_inductor_ro": ["llama-tiny"]}}}))
    text = summarize(str(tmp_path), "h100")
    assert "tests: exit 124" in text and "tests: no JUnit file" in text
    assert "replays [118]" in text and "above 1.1x reduce-overhead ['llama-tiny']" in text
    assert "models asked 2, done 1" in text
    assert "bandwidth: no record" in text


def test_the_tuning_before_and_after_is_set_side_by_side(tmp_path) -> None:
    def record(ms: dict) -> str:
        return json.dumps({"rows": [{"case": c, "fuseg_ms": v, "fuseg_device_ms": v / 2, "fuseg_vs_copy": v / 0.05}
                                    for c, v in ms.items()]
                          + [{"case": "broken", "error": "RuntimeError"}], "summary": {}})

    (tmp_path / "gpu_bandwidth_h100.json").write_text(record({"softmax": 0.06, "rope-seed": 0.02}))
    (tmp_path / "gpu_bandwidth_before_h100.json").write_text(record({"softmax": 0.08, "rope-seed": 0.04}))
    text = summarize(str(tmp_path), "h100")
    assert "after/before 0.75" in text and "after/before 0.50" in text
    assert "kernel 0.0400 -> 0.0300 ms, after/before 0.75" in text
    assert text.count("after/before") == 5  # the heading and the two cases both runs have (wall, kernel)


def test_the_loads_kept_before_and_after_is_its_own_section(tmp_path) -> None:
    def record(ms: dict) -> str:
        return json.dumps({"rows": [{"case": c, "fuseg_ms": v, "fuseg_device_ms": v, "fuseg_vs_copy": v / 0.05}
                                    for c, v in ms.items()], "summary": {}})

    (tmp_path / "gpu_bandwidth_h100.json").write_text(record({"softmax": 0.05, "rope-seed": 0.02}))
    (tmp_path / "gpu_bandwidth_loads_h100.json").write_text(record({"softmax": 0.0625}))
    text = summarize(str(tmp_path), "h100")
    assert "CUDA tuning" not in text  # no FUSEG_CUDA_TUNING=0 record
    section = text[text.index("Loads kept"):]
    assert "softmax  before 0.0625 ms  after 0.0500 ms  after/before 0.80  before/copy 1.25" in section
    assert "rope-seed" not in section  # only in the bandwidth record: nothing to set beside it


def test_the_kernels_per_call_are_summed_per_variant(tmp_path) -> None:
    (tmp_path / "gpu_kernels_h100.json").write_text(json.dumps({"rows": [
        {"model": "vit", "device": "cuda", "calls": 20, "fuseg_graphs_max_abs_diff": 0.0,
         "fuseg_graphs": {"kernels_per_call": 31.0, "us_per_call": 250.5, "top": []},
         "inductor_ro": {"kernels_per_call": 22.0, "us_per_call": 210.0, "top": []},
         "us_per_call_fuseg_graphs_minus_inductor_ro": 40.5}]}))
    text = summarize(str(tmp_path), "h100")
    assert "kernels per call (perf.gpu.gpu_kernels), vit: fuseg_graphs 31 kernels 250.5 us, inductor_ro 22 kernels 210.0 us" in text


def test_the_bias_before_and_after_sets_each_model_beside_the_compiled_step(tmp_path) -> None:
    rows = [{"model": "vit", "fuseg_ms": 1.0, "fuseg_graphs_ms": 0.30}]
    before = [{"model": "vit", "fuseg_ms": 1.25, "fuseg_graphs_ms": 0.40}, {"model": "bert-tiny", "fuseg_ms": 1.0}]
    (tmp_path / "gpu_compiled_h100.json").write_text(json.dumps({"rows": rows, "summary": {}}))
    (tmp_path / "gpu_compiled_bias_fused_h100.json").write_text(json.dumps({"rows": before}))
    text = summarize(str(tmp_path), "h100")
    assert "FUSEG_BIAS_AFTER_MATMUL=0 (before" in text
    line = next(x for x in text.splitlines() if x.strip().startswith("vit  fuseg before"))
    assert "after/before 0.80" in line and "after/before 0.75" in line
    assert "bert-tiny  fuseg before 1.000 after - after/before -" in text  # not in the compiled step


def test_the_whole_dims_before_is_the_off_record(tmp_path) -> None:
    def record(ms: dict) -> str:
        return json.dumps({"rows": [{"case": c, "fuseg_ms": v, "fuseg_device_ms": v, "fuseg_vs_copy": v / 0.05}
                                    for c, v in ms.items()], "summary": {}})

    (tmp_path / "gpu_bandwidth_h100.json").write_text(record({"rope-qwen2-7b": 0.072}))
    (tmp_path / "gpu_bandwidth_whole_off_h100.json").write_text(record({"rope-qwen2-7b": 0.080}))
    text = summarize(str(tmp_path), "h100")
    assert "FUSEG_BCAST_WHOLE=0 (before)" in text and "after/before 0.90" in text


def test_the_dynamic_shapes_records_are_summed_up(tmp_path) -> None:
    """The step ``dynamic``: builds per length, tokens or gradients against eager, plans and
    refusals, a failed backend's error; a missing record said so."""
    gen = {"results": {"qwen2": {"runs": [
        {"backend": "aot_eager", "first": 7.4, "second": 3.4, "new": 0.09, "steady": 0.1},
        {"backend": "fuseg", "first": 9.8, "second": 4.7, "new": 0.061, "steady": 0.065, "kernel_builds": [31, 12, 0, 0],
         "tokens_equal_eager": [True, True, False, True], "tokens_equal_eager_later_lengths": [True, True],
         "fuseg_programs": {"symbolic_plans": 2, "specialized_programs": 2, "symbolic_refused": []}}],
        "ratios": {"fuseg_second_over_aot_eager_second": 1.37, "fuseg_new_over_steady": 0.94}}}}
    (tmp_path / "gpu_dynamic_generate_h100.json").write_text(json.dumps(gen))
    text = summarize(str(tmp_path), "h100")
    assert "builds per length [31, 12, 0, 0]" in text and "tokens equal eager's 5 of 6" in text
    assert "symbolic plans 2, specialized 2, refused []" in text and "new 61.0 ms, steady 65.0 ms" in text
    assert "fuseg second / aot_eager second 1.37" in text
    assert "dynamic shapes (train): no record" in text
    train = {"results": {"qwen2": {"runs": [{"backend": "fuseg", "error": ["InvalidBackend: 'fuseg'"]}], "ratios": {}}}}
    (tmp_path / "gpu_dynamic_train_h100.json").write_text(json.dumps(train))
    assert "dynamic shapes (train), qwen2, fuseg: ERROR InvalidBackend: 'fuseg'" in summarize(str(tmp_path), "h100")


def test_the_slowest_call_after_the_second_is_named_with_its_collections(tmp_path) -> None:
    """The H100 run of 2026-11-28 had one generate of 350 ms among 46 ms ones: the summary names the
    slowest call from the third on and the full collections that fell in it (older records: not
    recorded)."""
    gen = {"results": {"qwen2": {"runs": [
        {"backend": "fuseg", "first": 5.5, "second": 2.8, "new": 0.049, "steady": 0.047,
         "seconds": [5.5, 2.8, 0.0497, 0.3568, 0.0469], "full_gc_ms": [300.0, 250.0, 0.0, 291.5, 0.0],
         "profile": {"wall_ms": 61.2, "device_kernels": 2400, "device_ms": 7.25, "launch_calls": 2350, "aten_calls": 5100,
                     "top_host_ops": []}},
        {"backend": "inductor", "first": 14.4, "second": 8.3, "new": 0.043, "steady": 0.042,
         "seconds": [14.4, 8.3, 0.0423, 0.0486, 0.0429]}],
        "ratios": {"fuseg_steady_over_inductor": 1.11, "fuseg_settled_after_builds_over_inductor": 1.091,
                   "fuseg_first_over_inductor": 0.383}}}}
    (tmp_path / "gpu_dynamic_generate_h100.json").write_text(json.dumps(gen))
    text = summarize(str(tmp_path), "h100")
    assert "slowest from the third call 356.8 ms (call 4, full collections 292 ms)" in text
    assert "slowest from the third call 48.6 ms (call 4, full collections not recorded)" in text
    assert "profiled generate 61 ms: 2400 device kernels (7.2 ms), 2350 launch calls, 5100 ATen calls" in text
    assert "fuseg / Inductor: steady 1.11, settled after the builds 1.09, first 0.38" in text
