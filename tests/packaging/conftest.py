"""Fixtures for the packaging tests: the collection as a user gets it.

``source_tree``: the files git would ship (tracked, plus untracked files that are not ignored),
copied into a temporary directory, so that build outputs of a dirty working tree never leak in.
``tarball``: ``ansible-galaxy collection build`` of that tree.
``installed``: the tarball installed into an empty collections path.
``user_env``: (env, cwd) of a user who has only that install: a fresh HOME, none of the caller's
ANSIBLE_* variables, no ansible_collections on sys.path, a working directory outside the checkout.

``gpusim``/``gpusim_factory`` come from the simulator (tests/gpusim/gpusimkit/pytest_plugin.py),
as in tests/functional/conftest.py.
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from pkg_helpers import TOP, ansible_env, copy_files, git_visible_files, run, tool  # noqa: E402

GPUSIM = os.path.join(TOP, "tests", "gpusim")
if GPUSIM not in sys.path:
    sys.path.insert(0, GPUSIM)

from gpusimkit.pytest_plugin import gpusim, gpusim_factory  # noqa: E402  (fixtures)

__all__ = ["gpusim", "gpusim_factory", "source_tree", "tarball", "installed", "user_env"]


@pytest.fixture(scope="session")
def source_tree(tmp_path_factory):
    dest = tmp_path_factory.mktemp("source") / "gpu"
    dest.mkdir()
    copy_files(TOP, git_visible_files(TOP), str(dest))
    return dest


@pytest.fixture(scope="session")
def tarball(source_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    home = tmp_path_factory.mktemp("home-build")
    run([tool("ansible-galaxy"), "collection", "build", "--output-path", out, source_tree],
        env=ansible_env(tmp_path_factory.mktemp("none"), home), cwd=str(out))
    built = sorted(out.glob("gpuops-gpu-*.tar.gz"))
    assert len(built) == 1, f"expected one tarball in {out}, found {built}"
    return built[0]


@pytest.fixture(scope="session")
def installed(tarball, tmp_path_factory):
    """The collections path (an empty directory before) that the tarball was installed into."""
    path = tmp_path_factory.mktemp("collections")
    home = tmp_path_factory.mktemp("home-install")
    run([tool("ansible-galaxy"), "collection", "install", "--force", "-p", path, tarball],
        env=ansible_env(path, home), cwd=str(home))
    assert (path / "ansible_collections" / "gpuops" / "gpu" / "MANIFEST.json").is_file()
    return path


@pytest.fixture
def user_env(installed, tmp_path):
    """(env, cwd): a user's shell with only the installed tarball, outside the repository."""
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    return ansible_env(installed, home), str(work)


# --- the support matrix, as this run found it ------------------------------------------------------
# {(controller Python, ansible-core asked for): {"ansible-core": the version installed, check: outcome}} of the
# support-matrix tests (test_controller_*), printed at the end of the run: what the README's matrix says.
MATRIX = {}
CHECKS = {"test_controller_runs_gpu_facts_on_the_oldest_target": "gpu_facts on the oldest target",
          "test_controller_reads_the_docs_and_the_playbooks": "ansible-doc, --syntax-check"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # pylint: disable=unused-argument
    outcome = yield
    report = outcome.get_result()
    check = CHECKS.get(item.originalname if hasattr(item, "originalname") else item.name)
    if check is None or not (report.when == "call" or report.failed or report.skipped):
        return
    params = item.callspec.params
    row = MATRIX.setdefault((params["version"], params["requirement"] or "this venv"), {})
    for name, value in item.user_properties:
        if name == "ansible_core":
            row["ansible-core"] = value
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        row[check] = "skipped: " + reason.replace("Skipped: ", "")
    else:
        row[check] = "passed" if report.passed else "FAILED"


def pytest_terminal_summary(terminalreporter):
    if not MATRIX:
        return
    write = terminalreporter.write_line
    write("")
    write("Support matrix (controller Python, ansible-core; tests/packaging section 6):")
    write("| controller Python | ansible-core asked for | installed | " + " | ".join(CHECKS.values()) + " |")
    write("| --- | --- | --- |" + " --- |" * len(CHECKS))
    for (python, requirement), row in sorted(MATRIX.items()):
        write(f"| {python} | {requirement} | {row.get('ansible-core', '-')} | "
              + " | ".join(row.get(c, "-") for c in CHECKS.values()) + " |")
