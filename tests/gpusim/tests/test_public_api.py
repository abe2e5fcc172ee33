"""What a test, a benchmark or a tool may use of the simulator and of the collection's runners (README "The public
API"): only gpusimkit's public names (``gpusimkit.__all__``, the SimHost methods, ``gpusimkit.pytest_plugin``), and
modules and playbooks run only through tests/functional/modrun.py (module_argv/run_module*, controller_env).

Static checks of the source (ast): no simulator is started. Each rule names the file and line that breaks it.
"""

import ast
import os
import sys

import pytest

GPUSIM = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = os.path.dirname(os.path.dirname(GPUSIM))
if GPUSIM not in sys.path:
    sys.path.insert(0, GPUSIM)

import gpusimkit  # noqa: E402
from gpusimkit.host import SimHost  # noqa: E402  (the kit's own tests may import its modules)

# Where the rules apply: everything that uses the simulator or runs the collection from outside the kit.
USERS = ("tests/functional", "benchmarks", "tools")
RUNNER_USERS = USERS + ("tests/packaging", "tests/gpusim/demo.py")
MODRUN = "tests/functional/modrun.py"
# Files that name a module without running it (path -> why).
NAMES_A_MODULE = {
    "tests/functional/crash_injection/sitecustomize.py": "names the module whose AnsiballZ interpreter it crashes; "
                                                         "the run is modrun's",
}


def sources(roots):
    for root in roots:
        path = os.path.join(TOP, root)
        if path.endswith(".py"):
            yield root, path
            continue
        for d, dirs, files in os.walk(path):
            dirs[:] = sorted(x for x in dirs if x not in ("__pycache__", "results"))
            for name in sorted(files):
                if name.endswith(".py"):
                    full = os.path.join(d, name)
                    yield os.path.relpath(full, TOP), full


def parsed(roots):
    for rel, full in sources(roots):
        with open(full, encoding="utf-8") as f:
            yield rel, ast.parse(f.read(), filename=rel)


def gpusimkit_uses(tree):
    """(line, what) of every use of a gpusimkit name in the file: imports, and attributes of the package imported
    as a name (``import gpusimkit as sim``: ``sim.starttime``)."""
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "gpusimkit":
                    aliases.add(a.asname or a.name)
                elif a.name.startswith("gpusimkit."):
                    yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "gpusimkit":
                for a in node.names:
                    yield node.lineno, f"gpusimkit.{a.name}"
            elif node.module.startswith("gpusimkit."):
                yield node.lineno, node.module
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            yield node.lineno, f"gpusimkit.{node.attr}"


def public(name):
    """A public name, a public module, or the package's own declaration of them (__all__, PUBLIC_MODULES)."""
    rest = name[len("gpusimkit."):]
    return rest in gpusimkit.__all__ or rest in ("__all__", "PUBLIC_MODULES") or rest.split(".")[0] in gpusimkit.PUBLIC_MODULES


def strings(tree):
    """(line, text) of every string constant that is not a docstring (an f-string: its constant parts joined)."""
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
        if isinstance(node, ast.JoinedStr):
            docs.update(id(v) for v in node.values)  # read as a whole below
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
            yield node.lineno, text
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def runner_sites(rel, tree):
    """What runs a module or builds ansible-playbook's environment by itself, outside modrun."""
    out = []
    for line, text in strings(tree):
        if "ANSIBLE_MODULE_ARGS" in text:
            out.append(f"{rel}:{line}: writes a module's args file (modrun.module_argv)")
        elif "plugins.modules." in text and rel not in NAMES_A_MODULE:
            out.append(f"{rel}:{line}: names a module to run it (modrun.module_argv)")
        elif text == "ANSIBLE_COLLECTIONS_PATH":
            out.append(f"{rel}:{line}: sets ANSIBLE_COLLECTIONS_PATH (modrun.controller_env)")
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "ANSIBLE_COLLECTIONS_PATH":
            out.append(f"{rel}:{node.value.lineno}: sets ANSIBLE_COLLECTIONS_PATH (modrun.controller_env)")
    return out


def test_the_public_names_exist():
    for name in gpusimkit.__all__:
        assert getattr(gpusimkit, name) is not None, name
    with pytest.raises(AttributeError, match="public"):
        gpusimkit.no_such_name  # noqa: B018  pylint: disable=pointless-statement
    assert gpusimkit.SimHost is SimHost


def test_the_readme_names_every_public_name_and_simhost_method():
    with open(os.path.join(GPUSIM, "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("### The public API", 1)[1].split("\n### ", 1)[0]
    methods = [m for m in vars(SimHost) if not m.startswith("_")]
    missing = [n for n in gpusimkit.__all__ + list(gpusimkit.PUBLIC_MODULES) if f"`{n}" not in section]
    missing += [f"SimHost.{m}" for m in methods if f"`host.{m}" not in section and f"`SimHost.{m}" not in section]
    assert missing == [], "README \"The public API\" does not name these"


def test_tests_benchmarks_and_tools_use_only_the_public_api():
    bad = [f"{rel}:{line}: {name}" for rel, tree in parsed(USERS) for line, name in gpusimkit_uses(tree) if not public(name)]
    assert bad == [], "internal gpusimkit names used outside the kit (README \"The public API\")"


def test_modules_and_playbooks_run_only_through_modrun():
    bad = [site for rel, tree in parsed(RUNNER_USERS) if rel != MODRUN for site in runner_sites(rel, tree)]
    assert bad == [], "a module runner or a playbook environment outside tests/functional/modrun.py"


SAMPLE = '''
import gpusimkit as sim
from gpusimkit import SimHost, container
from gpusimkit.sshd import throwaway_sshd
from gpusimkit.pytest_plugin import GpusimFactory
import gpusimkit.scenario
x = sim.starttime(1) + sim.proctools.starttime(1)
env = dict(ANSIBLE_COLLECTIONS_PATH="c")
env["ANSIBLE_COLLECTIONS_PATH"] = "c"
argv = ["python", "-m", f"ansible_collections.gpuops.gpu.plugins.modules.{name}"]
args = {"ANSIBLE_MODULE_ARGS": {}}
'''


def test_the_checks_find_what_they_look_for():
    tree = ast.parse(SAMPLE)
    assert sorted((line, n) for line, n in gpusimkit_uses(tree) if not public(n)) == [
        (3, "gpusimkit.container"), (4, "gpusimkit.sshd"), (6, "gpusimkit.scenario"), (7, "gpusimkit.proctools")]
    assert sorted(runner_sites("x.py", tree)) == [
        "x.py:10: names a module to run it (modrun.module_argv)",
        "x.py:11: writes a module's args file (modrun.module_argv)",
        "x.py:8: sets ANSIBLE_COLLECTIONS_PATH (modrun.controller_env)",
        "x.py:9: sets ANSIBLE_COLLECTIONS_PATH (modrun.controller_env)"]
