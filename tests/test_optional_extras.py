"""Optional extras skip where they are not installed, and CI notices: tests/conftest.py turns a skip for a missing
Flower (requirements-flower.txt, which .ci/run installs) into a failure when CI=true, whether a test skips itself
(pytest.importorskip with conftest.FLOWER_MISSING, or the mark conftest.needs_flower) or a whole test file skips at
its top; other skips (no GPU) stay skips. Checked on a planted test folder run by a child pytest with this
conftest as its plugin: a few seconds, nothing of Flower imported."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT

PLANTED = {
    "test_itself.py": (
        "import pytest\n"
        "from conftest import FLOWER_MISSING, needs_flower\n"
        "def test_imports_a_missing_extra():\n"
        "    pytest.importorskip('flwr_not_installed_here', reason=FLOWER_MISSING)\n"
        "@pytest.mark.skipif(True, reason=FLOWER_MISSING)  # needs_flower where Flower is missing\n"
        "def test_marked():\n"
        "    pass\n"
        "def test_needs_a_gpu():\n"
        "    pytest.skip('needs a CUDA GPU')\n"
        "def test_runs():\n"
        "    pass\n"),
    "test_whole_file.py": (
        "import pytest\n"
        "from conftest import FLOWER_MISSING\n"
        "pytest.importorskip('flwr_not_installed_here', reason=FLOWER_MISSING)\n"
        "def test_never_collected():\n"
        "    pass\n"),
}


def planted_run(tmp_path, ci):
    for name, text in PLANTED.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = "true"
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "tests"), ROOT, env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rsfE", "-p", "conftest", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "-W", "ignore::pytest.PytestUnknownMarkWarning", "-c", os.devnull,
                           "--rootdir", str(tmp_path), "--continue-on-collection-errors", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    return done.returncode, done.stdout


@pytest.mark.parametrize("ci", [False, True], ids=["here", "CI=true"])
def test_a_flower_skip_is_a_skip_here_and_a_failure_on_ci(ci, tmp_path):
    code, out = planted_run(tmp_path, ci)
    summary = out.strip().splitlines()[-1]
    if not ci:  # three skips for Flower (two tests, one file), one for the GPU; one test passes
        assert code == 0 and "1 passed" in summary and "4 skipped" in summary, out
        assert out.count("Flower is not installed") == 3, out
    else:  # the three Flower skips fail; the GPU's stays a skip
        assert code != 0 and "1 skipped" in summary, out
        assert "needs a CUDA GPU" in out and "SKIPPED" in out, out
        for where in ("test_itself.py::test_imports_a_missing_extra", "test_itself.py::test_marked",
                      "test_whole_file.py"):
            assert f"{where}: Skipped: Flower is not installed" in out, (where, out)
        assert out.count("but CI installs requirements-flower.txt") >= 3, out


def test_needs_flower_and_the_reason_are_conftest_s():
    """The mark skips exactly where flwr cannot be found, with the shared reason."""
    import importlib.util

    import conftest
    (mark,) = conftest.needs_flower.mark.args
    assert mark == (importlib.util.find_spec("flwr") is None)
    assert conftest.needs_flower.mark.kwargs["reason"] == conftest.FLOWER_MISSING
    assert conftest.SKIPPED_FOR_FLOWER.search(f"Skipped: {conftest.FLOWER_MISSING}")
    assert conftest.SKIPPED_FOR_FLOWER.search("could not import 'flwr': No module named 'flwr'")
    assert not conftest.SKIPPED_FOR_FLOWER.search("needs a CUDA GPU")
