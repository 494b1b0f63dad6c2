"""bench/compare_junit.py: outcomes test by test, from junit XML and `pytest -v` logs, across rootdirs."""
from bench.compare_junit import main

JUNIT = """<testsuites><testsuite>
<testcase classname="{prefix}test_a" name="test_one[1]" />
<testcase classname="{prefix}test_a" name="test_two"><skipped type="pytest.xfail" message="x" /></testcase>
<testcase classname="{prefix}test_b" name="test_three"><failure message="no" /></testcase>
<testcase time="0.003" />
</testsuite></testsuites>"""


def test_outcomes_compare_by_file_and_test_id_whatever_the_rootdir(tmp_path, capsys):
    ref = tmp_path / "ref.xml"
    ref.write_text(JUNIT.format(prefix="tests."))
    other = tmp_path / "other.xml"
    other.write_text(JUNIT.format(prefix=".gpu.lt.tests."))
    assert main([str(ref), "--", str(other)]) == 0
    other.write_text(JUNIT.format(prefix="x.").replace('<failure message="no" />', ""))
    assert main([str(ref), "--", str(other)]) == 1
    assert "test_b::test_three: failed -> passed" in capsys.readouterr().out


def test_a_verbose_log_is_a_side_and_ran_only_ignores_what_the_other_side_never_ran(tmp_path, capsys):
    log = tmp_path / "jit.txt"
    log.write_text("# header\ntests/test_a.py::test_one[1] PASSED\ntests/test_a.py::test_two XFAIL\n"
                   "tests/test_b.py::test_three FAILED\ntests/test_c.py::test_four PASSED\n")
    run = tmp_path / "served.xml"
    run.write_text(JUNIT.format(prefix=""))
    assert main([str(log), "--", str(run)]) == 1   # test_four: passed -> absent
    assert "test_c::test_four: passed -> absent" in capsys.readouterr().out
    assert main(["--ran-only", str(log), "--", str(run)]) == 0


def test_a_side_whose_junit_names_no_file_is_compared_by_test_id(tmp_path, capsys):
    # flag_gems's suite run from outside its rootdir wrote every classname empty
    ref = tmp_path / "ref.xml"
    ref.write_text(JUNIT.format(prefix="tests."))
    other = tmp_path / "other.xml"
    other.write_text(JUNIT.replace('classname="{prefix}test_a" ', 'classname="" ')
                     .replace('classname="{prefix}test_b" ', 'classname="" '))
    assert main([str(ref), "--", str(other)]) == 0
    other.write_text(other.read_text().replace('<failure message="no" />', ""))
    assert main([str(ref), "--", str(other)]) == 1
    assert "test_three: failed -> passed" in capsys.readouterr().out
