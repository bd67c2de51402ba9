"""Note [a disturbed measurement] (runtime/codegen/disturbance.py) and Note [how the thresholds
are measured] (calibrate.py): a measurement of the thread thresholds that another process
disturbed is recognised, measured again a bounded number of times, never kept, and a kept file
that holds one is measured again. The measuring is replaced by recorded ladders: no test here
depends on a timing."""

from __future__ import annotations

import json
import logging
import os

import pytest

from runtime.codegen import calibrate, disturbance, thresholds
from runtime.codegen.thresholds import UNMEASURED, Thresholds

# Recorded on the AMD EPYC (Zen 4, 2 vCPUs), medians in ns: (size, the first way, the second).
# A quiet machine: the loop from issue 64's brief, the others from a kept file of the same day.
QUIET_LOOP = [(512, 380, 686), (1024, 400, 701), (2048, 476, 731), (4096, 661, 811), (8192, 956, 986),
              (16384, 1677, 1442), (32768, 2914, 2284), (65536, 5438, 3831), (131072, 11356, 7547),
              (262144, 23100, 14942), (524288, 47145, 28152), (1048576, 90855, 56348)]
QUIET = {
    "loop_ns": QUIET_LOOP,
    "beside_loop_ns": [(512, 1387.5, 691), (1024, 1272, 761), (2048, 1557.5, 986), (4096, 1768, 1327),
                       (8192, 2188.5, 1993), (16384, 3055, 2759), (32768, 4632, 4151), (65536, 8262, 7296),
                       (131072, 16073.5, 14181), (262144, 27320, 27496), (524288, 55787.5, 51747),
                       (1048576, 127374, 127359)],
    "macs_ns": [(8192, 801, 792), (27648, 1533, 1532.5), (65536, 1993, 1998), (221184, 5738, 3826),
                (524288, 11367, 7346), (1769472, 34286, 23289.5), (4194304, 81370, 44155.5),
                (14155776, 268838.5, 144539.5), (33554432, 637160, 332328)],
    "beside_macs_ns": [(8192, 2098, 1627.5), (27648, 3029.5, 3099.5), (65536, 3510, 4016), (221184, 8162, 8027),
                       (524288, 13886, 15132.5), (1769472, 39914, 46780), (4194304, 89112.5, 87424.5),
                       (14155776, 269445, 279639.5), (33554432, 639989.5, 642698)],
    "pack_rows_ns": [(2, 6004, 6820.5), (3, 6299.5, 6870), (4, 6404.5, 6880.5), (5, 8162, 6881), (6, 11982.5, 6900),
                     (8, 12463.5, 10370), (12, 18508, 10505), (16, 24496.5, 13995.5), (24, 36634, 17556),
                     (32, 48682, 24561.5)],
    "nn_pack_rows_ns": [(16, 190538, 243176), (32, 381570.5, 437173.5), (48, 523281, 571633), (64, 710739, 771364),
                        (96, 1056537, 1115234), (128, 1435128.5, 1539378.5)],
    "plain_ns_an_element": 0.0887, "exp_ns_an_element": 0.602, "threads": 2,
}
# The kept file that said loop = 2^21 while another process held the second core: its loop
# ladder, and a rung of its beside_loop ladder (two loops side by side 16 ms)
DISTURBED_LOOP = [(512, 916, 8003856), (1024, 1938, 15998698), (2048, 2614, 18442813), (4096, 4296, 19995190),
                  (8192, 4367, 20006157), (16384, 4927, 20005086), (32768, 8793, 20005435), (65536, 13560, 19988032),
                  (131072, 19488, 21046843), (262144, 38887, 26193), (524288, 65152, 42613),
                  (1048576, 177438, 20002141)]
DISTURBED = {**QUIET, "loop_ns": DISTURBED_LOOP,
             "beside_loop_ns": [(8192, 15996299.5, 1782.5) if r[0] == 8192 else r for r in QUIET["beside_loop_ns"]]}
ALONE = {"loop": calibrate._threshold(QUIET_LOOP), "macs": calibrate._threshold(QUIET["macs_ns"])}


def _jsonable(detail: dict) -> dict:
    return json.loads(json.dumps(detail))  # (tuples as the kept file holds them: lists)


# -- the rule -------------------------------------------------------------------------------------

def test_the_recorded_disturbed_ladders_are_recognised_and_the_quiet_ones_are_not() -> None:
    assert calibrate._threshold(DISTURBED_LOOP) == 2 * 1048576  # (what was kept: threads never pay)
    assert ALONE["loop"] == 16384
    assert disturbance.disturbed(QUIET, ALONE) == []
    found = disturbance.disturbed(DISTURBED, ALONE)
    assert any(line.startswith("loop at 512: the threads 8 ms") for line in found), found
    assert any(line.startswith("loop at 1048576: the threads 20 ms, one thread 177 us") for line in found), found
    assert any(line.startswith("beside_loop at 8192: side by side 16 ms") for line in found), found
    assert not any(line.startswith(("macs", "pack_rows", "nn_pack_rows", "beside_macs")) for line in found)
    # each ladder on its own, as the measurement judges it while it climbs down the sizes
    assert disturbance.rungs_disturbed("loop", QUIET_LOOP, 2) == []
    assert disturbance.rungs_disturbed("loop", DISTURBED_LOOP[-1:], 2)  # (the largest alone: the ways apart)
    assert disturbance.rungs_disturbed("loop", DISTURBED_LOOP[-3:-1], 2) == []  # (2^18, 2^19 were clean)


S = disturbance.SLACK
EDGES = [
    # (name, ladder, threads, alone, disturbed)
    ("flat", [(1, 100, 100), (2, 100, 100), (4, 100, 100)], 2, None, False),
    ("a smaller size SLACK times a larger", [(1, 100, 400 * S), (2, 300, 400)], 2, None, False),
    ("a smaller size just over SLACK times", [(1, 100, 400 * S + 1), (2, 300, 400)], 2, None, True),
    ("over SLACK times a larger size but not the largest", [(1, 100, 5000), (2, 300, 400), (4, 600, 5000)], 2, None,
     True),
    ("the first way too", [(1, 100 * S + 1, 50), (2, 100, 60)], 2, None, True),
    ("the largest size's ways SLACK x threads apart", [(1, 10, 10), (2, 100, 100 * S * 2)], 2, None, False),
    ("just over it", [(1, 10, 10), (2, 100, 100 * S * 2 + 1)], 2, None, True),
    ("the same ratio on 4 threads", [(1, 10, 10), (2, 100, 100 * S * 2 + 1)], 4, None, False),
    ("one rung", [(1, 1000, 1000)], 2, None, False),
    ("one rung, the ways far apart", [(1, 1000, 1000 * S * 2 + 1)], 2, None, True),
]
BESIDE_EDGES = [
    # the second way runs on the threads from ``alone``: a larger size on them may be faster by
    # up to SLACK x threads; without that change of threads only by SLACK
    ("beside_loop", [(1, 100, 1000), (2, 200, 1000 / (S + 1))], 2, 2, False),
    ("beside_loop", [(1, 100, 1000), (2, 200, 1000 / (S + 1))], 2, None, True),
    ("beside_loop", [(1, 100, 1000), (2, 200, 1000 / (2 * S) - 1)], 2, 2, True),
    ("beside_macs", [(1, 100, 1000), (2, 200, 1000 / (S + 1))], 2, 2, False),
    ("loop", [(1, 100, 1000), (2, 200, 1000 / (S + 1))], 2, 2, True),  # (loop's ways never change)
]


@pytest.mark.parametrize("name, ladder, threads, alone, want", [("loop", *e[1:]) for e in EDGES] + BESIDE_EDGES,
                         ids=[e[0] for e in EDGES] + [f"{e[0]}-{e[3]}-{e[4]}" for e in BESIDE_EDGES])
def test_the_rule_at_its_edges(name, ladder, threads, alone, want) -> None:
    assert S == 4
    got = disturbance.rungs_disturbed(name, ladder, threads, alone)
    assert bool(got) == want, got
    assert bool(disturbance.rungs_disturbed(name, list(reversed(ladder)), threads, alone)) == want  # (any order)


@pytest.mark.parametrize("bad", [[(1, "x", 2)], [(1, 2)], "not a ladder"])
def test_a_ladder_that_is_not_one_raises(bad) -> None:
    with pytest.raises((ValueError, TypeError)):
        disturbance.rungs_disturbed("loop", bad, 2)


# -- measured again, never kept -------------------------------------------------------------------

@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """No setting, an empty cache dir, nothing resolved; no real sleeping between attempts."""
    monkeypatch.delenv("FUSEG_THREAD_THRESHOLDS", raising=False)
    monkeypatch.setenv("FUSEG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(thresholds, "_RESOLVED", {})
    monkeypatch.setattr(calibrate, "_PREPARED", {})
    monkeypatch.setattr(calibrate, "_LAST", {})
    slept: list[float] = []
    monkeypatch.setattr(calibrate, "_sleep", slept.append)
    return slept


def _measuring(monkeypatch, *details: dict) -> list[int]:
    """``calibrate._measure_ladders`` gives ``details`` in turn (the last one from then on);
    the thread counts it was asked for."""
    asked: list[int] = []

    def fake(threads: int) -> dict:
        asked.append(threads)
        return _jsonable(details[min(len(asked), len(details)) - 1])

    monkeypatch.setattr(calibrate, "_measure_ladders", fake)
    return asked


def _quiet_thresholds(how: str) -> Thresholds:
    return calibrate._thresholds_of(_jsonable(QUIET), how)


def test_a_disturbed_measurement_is_measured_again_and_the_quiet_one_kept(fresh, monkeypatch, caplog) -> None:
    asked = _measuring(monkeypatch, DISTURBED, QUIET)
    with caplog.at_level(logging.INFO, logger="fuseg"):
        got = calibrate.kept_or_measured(2)
    assert asked == [2, 2] and len(fresh) == 1 and 0 < fresh[0] <= calibrate.RETRY_PAUSE
    assert got == _quiet_thresholds("measured") and got.loop == 16384
    kept = json.load(open(calibrate.thresholds_path(2)))
    assert kept["loop"] == 16384 and kept["measured"]["loop_ns"] == _jsonable(QUIET)["loop_ns"]
    assert "disturbed" in caplog.text and "kept in" in caplog.text
    _measuring(monkeypatch, DISTURBED)  # (kept: not measured again)
    assert calibrate.kept_or_measured(2) == _quiet_thresholds("kept")


def test_a_measurement_that_stays_disturbed_keeps_nothing(fresh, monkeypatch, caplog) -> None:
    asked = _measuring(monkeypatch, DISTURBED)
    with caplog.at_level(logging.INFO, logger="fuseg"):
        got = thresholds.resolve(2)
    assert len(asked) == calibrate.ATTEMPTS and len(fresh) == calibrate.ATTEMPTS - 1
    # this process: the unmeasured thresholds, said to be so; nothing kept
    assert got == Thresholds(UNMEASURED.loop, UNMEASURED.macs, "disturbed", UNMEASURED.costly_call,
                             UNMEASURED.beside_loop, UNMEASURED.beside_macs, UNMEASURED.pack_rows,
                             UNMEASURED.nn_pack_rows)
    assert not os.path.exists(calibrate.thresholds_path(2))
    assert calibrate.kept_detail(2) == {}
    assert "disturbed (not kept)" in caplog.text and "loop at 512" in caplog.text
    assert calibrate.last_detail(2)["disturbed"] and calibrate.last_detail(2)["attempts"] == calibrate.ATTEMPTS
    # the next process measures again, and keeps a quiet measurement
    _measuring(monkeypatch, QUIET)
    assert calibrate.kept_or_measured(2) == _quiet_thresholds("measured")
    assert os.path.exists(calibrate.thresholds_path(2))


def test_the_retries_stop_when_their_time_is_spent(fresh, monkeypatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(calibrate, "_now", lambda: clock[0])
    monkeypatch.setattr(calibrate, "_sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    asked: list[int] = []

    def slow(threads: int) -> dict:  # (each disturbed attempt takes the whole budget: one more, no third)
        asked.append(threads)
        clock[0] += calibrate.RETRY_BUDGET
        return _jsonable(DISTURBED)

    monkeypatch.setattr(calibrate, "_measure_ladders", slow)
    assert calibrate.ATTEMPTS >= 3
    got, detail = calibrate.measure(2)
    assert got.how == "disturbed" and len(asked) == 2 and detail["attempts"] == 2


def test_keep_refuses_a_disturbed_measurement(fresh) -> None:
    calibrate.keep(2, _quiet_thresholds("measured"), _jsonable(DISTURBED))
    assert not os.path.exists(calibrate.thresholds_path(2))
    calibrate.keep(2, _quiet_thresholds("measured"), _jsonable(QUIET))
    assert calibrate.kept_or_measured(2) == _quiet_thresholds("kept")


def test_a_kept_file_with_a_disturbed_ladder_is_measured_again(fresh, monkeypatch, caplog) -> None:
    # the file as it was kept before disturbed measurements were recognised
    bad = Thresholds(2 * 1048576, ALONE["macs"], "measured", 6, 2 * 1048576, 1 << 22, 5, 256)
    body = {"machine": calibrate.machine(), "threads": 2, **{k: getattr(bad, k) for k in calibrate.FIELDS},
            "measured": _jsonable(DISTURBED)}
    with open(calibrate.thresholds_path(2), "w", encoding="utf-8") as f:
        json.dump(body, f)
    assert calibrate.kept_detail(2) == {}  # (nothing kept that counts)
    asked = _measuring(monkeypatch, QUIET)
    with caplog.at_level(logging.INFO, logger="fuseg"):
        got = calibrate.kept_or_measured(2)
    assert asked == [2] and got == _quiet_thresholds("measured")
    assert "disturbed measurement" in caplog.text and "measuring again" in caplog.text
    assert json.load(open(calibrate.thresholds_path(2)))["loop"] == 16384
    assert calibrate.kept_or_measured(2) == _quiet_thresholds("kept")


def test_the_measurement_stops_at_its_first_disturbed_rung(monkeypatch) -> None:
    """The ladders climb down from the largest size, each rung judged as it comes: a disturbed
    attempt costs the rungs up to the first disturbed one, not the whole measurement."""
    recorded = {name: dict((r[0], r[1:]) for r in DISTURBED[f"{name}_ns"]) for name in disturbance.LADDERS}
    runs: list[tuple[str, int]] = []

    def run(name: str, arg: int, alone: int) -> tuple[float, float]:
        size = 2 * arg ** 3 if name.endswith("macs") else arg
        runs.append((name, size))
        return recorded[name][size]

    detail = calibrate._ladders_of(run, 2)
    # loop at 2^20 is found at once (20 ms on the threads against 177 us on one): nothing more runs
    assert runs == [("loop", 1 << 20)]
    assert detail["loop_ns"] == [(1 << 20, 177438, 20002141)] and detail["threads"] == 2
    assert disturbance.disturbed(detail, {}) and "macs_ns" not in detail

    recorded["loop"] = dict((r[0], r[1:]) for r in QUIET_LOOP)
    runs.clear()
    detail = calibrate._ladders_of(run, 2)
    assert [n for n, _ in runs] == ["loop"] * 12 + ["beside_loop"] * 8  # (down to 2^13, where 16 ms is found)
    assert [s for _, s in runs[:12]] == [1 << b for b in reversed(calibrate._LOOP_BITS)]
    assert [r[0] for r in detail["loop_ns"]] == [1 << b for b in calibrate._LOOP_BITS]  # (kept by size)

    recorded["beside_loop"] = dict((r[0], r[1:]) for r in QUIET["beside_loop_ns"])
    recorded["costly"] = {1 << 18: (0.0887 * (1 << 18), 0.602 * (1 << 18))}
    detail = calibrate._ladders_of(run, 2)
    assert disturbance.disturbed(detail, ALONE) == []
    assert {k: [tuple(r) for r in v] for k, v in detail.items() if k.endswith("_ns")} == \
        {k: [tuple(r) for r in v] for k, v in QUIET.items() if k.endswith("_ns")}
    assert calibrate._thresholds_of(detail, "measured") == _quiet_thresholds("measured")


def test_the_cli_says_disturbed_not_kept(fresh, monkeypatch, capsys) -> None:
    from perf.tools.cli import main

    _measuring(monkeypatch, DISTURBED)
    assert main(["threads", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["how"] == "disturbed" and got["loop"] == UNMEASURED.loop
    assert got["measured"]["disturbed"] and not os.path.exists(got["path"])
    monkeypatch.setattr(thresholds, "_RESOLVED", {})
    assert main(["threads"]) == 0
    text = capsys.readouterr().out
    assert "disturbed (not kept)" in text and "loop at 512" in text
