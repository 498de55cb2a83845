"""The end-of-run report of where the time went, against sums done by hand."""

from __future__ import annotations

from tests.support.timing import FILE_BUDGET_S, file_seconds, report


def test_phases_add_up_per_file() -> None:
    durations = [
        ("tests/a.py::test_one", 1.5),
        ("tests/a.py::test_one", 2.0),
        ("tests/b.py::test_two[1]", 4.0),
        ("tests/a.py::test_three", 0.5),
    ]
    assert file_seconds(durations) == {"tests/a.py": 4.0, "tests/b.py": 4.0}


def test_the_slowest_come_first_and_a_file_over_budget_is_a_warning() -> None:
    per_file = {f"tests/f{i}.py": float(i) for i in range(12)}
    per_file["tests/slow.py"] = FILE_BUDGET_S + 1
    lines = report(per_file, wall_s=300.4)
    assert lines[0] == "the 10 slowest test files:"
    assert lines[1].endswith("tests/slow.py")
    assert lines[2].endswith("tests/f11.py")
    assert len([line for line in lines if line.startswith("  ")]) == 10
    warnings = [line for line in lines if line.startswith("WARNING")]
    assert len(warnings) == 1
    assert "tests/slow.py took 121 s" in warnings[0]
    assert lines[-1] == "wall time of the run: 300 s"


def test_a_run_of_few_files_lists_them_all_and_warns_of_none() -> None:
    lines = report({"tests/a.py": FILE_BUDGET_S}, wall_s=1)
    assert lines == [
        "the 1 slowest test files:",
        f"  {FILE_BUDGET_S:7.1f} s  tests/a.py",
        "wall time of the run: 1 s",
    ]
