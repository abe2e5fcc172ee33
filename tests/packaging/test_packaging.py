"""Release packaging of gpuops.gpu, checked the way a user meets the collection.

1. Build and install: the Galaxy tarball has no development artefacts; installed into an empty
   collections path it is all a user needs for ansible-doc on every module, plugin and role and for
   ansible-playbook --syntax-check of the playbooks.
2. Execution environment: ansible-builder writes an EE build context with this collection, and the
   context's own introspection finds meta/ee-requirements.txt and meta/ee-bindep.txt.
3. Changelog: antsibull-changelog lint; one release summary per release; the releases announce every
   module, plugin, role and playbook.
4. Docs: antsibull-docs lints and renders every page without a warning; docs/build.sh builds the site.
5. Each role's README agrees with its argument spec (and its defaults/main.yml).
6. Support matrix: the controller ansible-core versions that install on this machine's Pythons read
   the docs and run gpu_facts on the oldest target Python (nvidia-smi fallback) on a simulated host.
"""

import concurrent.futures
import fnmatch
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest
import yaml

from pkg_helpers import BIN, TOP, ansible_env, git_visible_files, pyenv_python, run, tool

COLLECTION = "gpuops.gpu"


def _names(subdir, suffix):
    path = os.path.join(TOP, subdir)
    return sorted(f[: -len(suffix)] for f in os.listdir(path) if f.endswith(suffix) and not f.startswith(("_", ".")))


MODULES = _names("plugins/modules", ".py")
FILTERS = _names("plugins/filter", ".py")  # one documented filter per file, named like the file
ROLES = sorted(r for r in os.listdir(os.path.join(TOP, "roles")) if os.path.isfile(os.path.join(TOP, "roles", r, "meta", "argument_specs.yml")))
PLAYBOOKS = _names("playbooks", ".yml")


def test_the_collection_has_what_the_packaging_tests_expect():
    assert set(MODULES) >= {"gpu_facts", "gpu_release", "gpu_wait_idle"}
    assert "gpu_query" in FILTERS
    assert set(ROLES) >= {"gpu_idle", "proxmox_fence"}
    assert set(PLAYBOOKS) >= {"predeploy", "gpu_report"}


# --- 1. build and install ------------------------------------------------------------------------

# Development artefacts that must never be in the tarball (fnmatch on the member path; "*" spans "/").
FORBIDDEN = [
    ".venv", ".venv/*", ".venv-*", "build", "build/*", "dist", "dist/*", "ansible_collections", "ansible_collections/*",
    "tests/gpusim/build", "tests/gpusim/build/*", "*.so", "*.so.*", "*.o", "*__pycache__*", "*.pyc",
    "tests/output", "tests/output/*", "benchmarks/results", "benchmarks/results/*", ".git", ".git/*", "*/.git", "*/.git/*",
    ".gitignore", ".ci", ".ci/*", ".cache", ".cache/*", "*.pytest_cache*", "*.tar.gz",
    "tests/integration/integration_config.yml", "changelogs/.plugin-cache.yaml", "Makefile", "requirements.txt", "constraints.txt",
    ".ansible-lint",
]


def _members(path):
    with tarfile.open(path) as tar:
        return sorted(m.name[2:] if m.name.startswith("./") else m.name for m in tar.getmembers())


def _forbidden(members):
    return sorted(m for m in members if any(fnmatch.fnmatch(m, p) for p in FORBIDDEN))


def test_tarball_has_no_development_artefacts(tarball):
    members = _members(tarball)
    assert "MANIFEST.json" in members and "FILES.json" in members
    assert "plugins/modules/gpu_facts.py" in members and "meta/execution-environment.yml" in members
    # the rendered changelog ships with the collection (Galaxy and Automation Hub show it)
    assert "CHANGELOG.md" in members and "CHANGELOG.rst" in members and "changelogs/changelog.yaml" in members
    assert _forbidden(members) == []
    with tarfile.open(tarball) as tar:
        manifest = json.load(tar.extractfile("MANIFEST.json"))
    info = manifest["collection_info"]
    with open(os.path.join(TOP, "galaxy.yml"), encoding="utf-8") as f:
        galaxy = yaml.safe_load(f)
    assert (info["namespace"], info["name"], info["version"]) == (galaxy["namespace"], galaxy["name"], galaxy["version"])
    assert os.path.basename(tarball) == f"gpuops-gpu-{galaxy['version']}.tar.gz"


def test_build_from_the_working_tree_leaves_ignored_files_out(tmp_path):
    """galaxy.yml's build_ignore covers what git ignores: a build straight from a dirty working tree
    (a venv, the simulator's library, ansible-test output, ...) ships none of it."""
    home = tmp_path / "home"
    home.mkdir()
    run([tool("ansible-galaxy"), "collection", "build", "--output-path", tmp_path, TOP],
        env=ansible_env(tmp_path / "none", home), cwd=str(tmp_path))
    (built,) = tmp_path.glob("gpuops-gpu-*.tar.gz")
    members = _members(built)
    assert _forbidden(members) == []
    ignored = subprocess.run(["git", "ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory"],
                             cwd=TOP, capture_output=True, check=True).stdout.decode().split("\0")
    ignored = [p.rstrip("/") for p in ignored if p]
    leaked = sorted(m for m in members if any(m == p or m.startswith(p + "/") for p in ignored))
    assert leaked == [], "ignored by git but shipped by ansible-galaxy collection build: add them to build_ignore"
    assert set(m for m in members if not m.endswith(".json")) >= set(
        f for f in git_visible_files(TOP) if f.startswith(("plugins/", "roles/", "playbooks/", "meta/")))


def test_installed_from_the_tarball_only(user_env, installed):
    env, cwd = user_env
    out = run([tool("ansible-galaxy"), "collection", "list", COLLECTION, "--format", "json"], env=env, cwd=cwd).stdout
    found = json.loads(out)
    assert list(found) == [str(installed / "ansible_collections")]
    assert COLLECTION in found[str(installed / "ansible_collections")]


def warnings_in(text):
    """Ansible's warnings in text, less ansible-core 2.21's own about its internal _protomatter collection."""
    return [ln for ln in text.splitlines() if "WARNING" in ln and "/ansible_collections/ansible/_protomatter" not in ln]


def _doc_json(env, cwd, plugin_type, name):
    proc = run([tool("ansible-doc"), "-t", plugin_type, "--json", name], env=env, cwd=cwd)
    assert warnings_in(proc.stderr) == []
    return json.loads(proc.stdout)[name]


@pytest.mark.parametrize("module", MODULES)
def test_ansible_doc_module(user_env, installed, module):
    env, cwd = user_env
    data = _doc_json(env, cwd, "module", f"{COLLECTION}.{module}")
    doc = data["doc"]
    assert doc["module"] == module and doc["short_description"] and doc["version_added"]
    assert doc["filename"].startswith(str(installed)), doc["filename"]
    assert data["examples"] and data["return"]
    text = run([tool("ansible-doc"), f"{COLLECTION}.{module}"], env=env, cwd=cwd).stdout
    assert f"{COLLECTION}.{module}" in text


@pytest.mark.parametrize("name", FILTERS)
def test_ansible_doc_filter(user_env, installed, name):
    env, cwd = user_env
    data = _doc_json(env, cwd, "filter", f"{COLLECTION}.{name}")
    assert data["doc"]["short_description"] and data["examples"] and data["return"]
    assert data["doc"]["filename"].startswith(str(installed))


def test_ansible_doc_lists_exactly_the_plugins_and_roles(user_env):
    env, cwd = user_env
    modules = json.loads(run([tool("ansible-doc"), "-t", "module", "-l", COLLECTION, "--json"], env=env, cwd=cwd).stdout)
    assert sorted(modules) == [f"{COLLECTION}.{m}" for m in MODULES]
    filters = json.loads(run([tool("ansible-doc"), "-t", "filter", "-l", COLLECTION, "--json"], env=env, cwd=cwd).stdout)
    assert sorted(filters) == [f"{COLLECTION}.{f}" for f in FILTERS]
    roles = json.loads(run([tool("ansible-doc"), "-t", "role", "-l", COLLECTION, "--json"], env=env, cwd=cwd).stdout)
    assert sorted(roles) == [f"{COLLECTION}.{r}" for r in ROLES]


@pytest.mark.parametrize("role", ROLES)
def test_ansible_doc_role(user_env, installed, role):
    env, cwd = user_env
    data = _doc_json(env, cwd, "role", f"{COLLECTION}.{role}")
    main = data["entry_points"]["main"]
    assert main["short_description"] and main["options"]
    assert data["path"].startswith(str(installed)), data["path"]
    text = run([tool("ansible-doc"), "-t", "role", f"{COLLECTION}.{role}"], env=env, cwd=cwd).stdout
    assert re.search(r"ENTRY POINT: \W*main\b", text), text[:500]


INVENTORY = """\
all:
  vars:
    ansible_connection: local
    ansible_python_interpreter: {python}
  children:
    proxmox_nodes:
      hosts:
        pve: {{}}
    gpu_hosts:
      hosts:
        gpu-ct: {{proxmox_node: pve, proxmox_vmid: 129}}
"""


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_playbook_syntax_check(user_env, tmp_path, playbook):
    env, cwd = user_env
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(INVENTORY.format(python=sys.executable))
    proc = run([tool("ansible-playbook"), f"{COLLECTION}.{playbook}", "-i", inventory, "--syntax-check"], env=env, cwd=cwd)
    assert warnings_in(proc.stdout + proc.stderr) == []


def test_roles_resolve_statically_from_the_install(user_env, tmp_path):
    """include_role is dynamic, so the playbooks' syntax check does not load the roles: import them."""
    env, cwd = user_env
    play = tmp_path / "roles.yml"
    play.write_text("---\n" + "".join(
        f"- name: Import {r}\n  hosts: localhost\n  gather_facts: false\n  tasks:\n"
        f"    - name: Import the role\n      ansible.builtin.import_role:\n        name: {COLLECTION}.{r}\n" for r in ROLES))
    proc = run([tool("ansible-playbook"), play, "-i", "localhost,", "--list-tasks"], env=env, cwd=cwd)
    for role in ROLES:
        assert f"{role} : " in proc.stdout, proc.stdout


# --- 2. execution environment --------------------------------------------------------------------

def _requirement_names(lines):
    from packaging.requirements import Requirement  # noqa: PLC0415 (ansible-core depends on packaging)

    names = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(Requirement(line).name.lower())
    return names


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return [ln.rstrip("\n") for ln in f if ln.strip() and not ln.lstrip().startswith("#")]


def test_collection_ee_metadata():
    with open(os.path.join(TOP, "meta", "execution-environment.yml"), encoding="utf-8") as f:
        meta = yaml.safe_load(f)
    assert meta == {"version": 1, "dependencies": {"python": "meta/ee-requirements.txt", "system": "meta/ee-bindep.txt"}}
    assert sorted(_requirement_names(_lines(os.path.join(TOP, "meta", "ee-requirements.txt")))) == ["jmespath", "nvidia-ml-py"]
    from bindep.depends import Depends  # noqa: PLC0415 (ansible-builder depends on bindep)

    with open(os.path.join(TOP, "meta", "ee-bindep.txt"), encoding="utf-8") as f:
        depends = Depends(f.read())  # raises on a syntax error
    for profiles in (["platform:rpm", "platform:redhat"], ["platform:dpkg", "platform:debian"]):
        assert depends.active_rules(profiles), f"no system package for {profiles}"


def readme_ee_definition(tarball):
    """The README's EE definition ("In AWX"), its tarball name and path made this build's."""
    with open(os.path.join(TOP, "README.md"), encoding="utf-8") as f:
        block = re.search(r"A minimal EE definition.*?```yaml\n(.*?)```", f.read(), re.S)
    assert block, "README.md: no EE definition after 'A minimal EE definition'"
    definition = yaml.safe_load(block.group(1))
    definition["dependencies"]["galaxy"] = {"collections": [{"name": f"collections/{tarball.name}", "type": "file"}]}
    definition["additional_build_files"] = [{"src": str(tarball), "dest": "collections"}]
    return definition


def test_ansible_builder_create_writes_a_context_with_the_collection(tarball, tmp_path):
    ee = tmp_path / "ee"
    ee.mkdir()
    definition = readme_ee_definition(tarball)
    (ee / "execution-environment.yml").write_text(yaml.safe_dump(definition, sort_keys=False))
    context = tmp_path / "context"
    run([tool("ansible-builder"), "create", "--file", ee / "execution-environment.yml", "--context", context,
         "--output-filename", "Containerfile", "-v", "3"], cwd=str(ee))

    containerfile = (context / "Containerfile").read_text()
    # ansible-core 2.20+ needs Python 3.12+ on the controller side: the EE names its interpreter, installs it and
    # installs ansible-core with it (the base image's default Python may be older)
    interpreter = definition["dependencies"]["python_interpreter"]
    version = tuple(int(n) for n in re.fullmatch(r"/usr/bin/python(\d+)\.(\d+)", interpreter["python_path"]).groups())
    assert version >= (3, 12), interpreter
    assert f'ARG PYCMD="{interpreter["python_path"]}"' in containerfile, containerfile[:2000]
    assert f'ARG PYPKG="{interpreter["package_system"]}"' in containerfile, containerfile[:2000]
    assert "RUN $PYCMD -m pip install --no-cache-dir $ANSIBLE_INSTALL_REFS" in containerfile
    assert 'ANSIBLE_INSTALL_REFS="ansible-core>=2.20' in containerfile
    assert "ansible-galaxy collection install" in containerfile and "-r requirements.yml" in containerfile
    assert "introspect.py introspect" in containerfile
    build = context / "_build"
    with open(build / "requirements.yml", encoding="utf-8") as f:
        assert yaml.safe_load(f) == {"collections": [{"name": f"collections/{tarball.name}", "type": "file"}]}
    copied = build / "collections" / tarball.name
    assert copied.is_file(), "additional_build_files did not copy the tarball (ansible-builder only warns)"
    assert hashlib.sha256(copied.read_bytes()).hexdigest() == hashlib.sha256(tarball.read_bytes()).hexdigest()
    assert (build / "scripts" / "introspect.py").is_file()

    # What the image build does next, without a container engine: the galaxy stage installs the
    # requirements from _build (its WORKDIR), then the builder stage introspects the collections.
    collections = tmp_path / "usr-share-ansible-collections"
    home = tmp_path / "home"
    home.mkdir()
    run([tool("ansible-galaxy"), "collection", "install", "-r", "requirements.yml", "--collections-path", collections],
        env=ansible_env(collections, home), cwd=str(build))
    assert (collections / "ansible_collections" / "gpuops" / "gpu" / "MANIFEST.json").is_file()
    pip_out, bindep_out = tmp_path / "requirements.txt", tmp_path / "bindep.txt"
    run([sys.executable, build / "scripts" / "introspect.py", "introspect", "--write-pip", pip_out,
         "--write-bindep", bindep_out, collections])
    pip_lines, bindep_lines = _lines(pip_out), _lines(bindep_out)
    ours = _lines(os.path.join(TOP, "meta", "ee-requirements.txt"))
    assert sorted(_requirement_names(pip_lines)) == sorted(_requirement_names(ours))
    assert all("# from collection gpuops.gpu" in ln for ln in pip_lines), pip_lines
    # not the development requirements.txt of the checkout (what ansible-builder falls back to
    # when a collection has no meta/execution-environment.yml)
    assert not {"pytest", "molecule", "ansible-lint"} & set(_requirement_names(pip_lines))
    ours_sys = _lines(os.path.join(TOP, "meta", "ee-bindep.txt"))
    assert [ln.split("#", 1)[0].strip() for ln in bindep_lines] == [ln.strip() for ln in ours_sys]


# --- 3. changelog --------------------------------------------------------------------------------

def test_antsibull_changelog_lint(source_tree):
    proc = run([tool("antsibull-changelog"), "lint"], cwd=str(source_tree))
    assert proc.stdout.strip() == "" and "ERROR" not in proc.stderr, proc.stdout + proc.stderr
    run([tool("antsibull-changelog"), "lint-changelog-yaml", "changelogs/changelog.yaml"], cwd=str(source_tree))


def test_release_summary_fragment_for_the_first_release():
    with open(os.path.join(TOP, "galaxy.yml"), encoding="utf-8") as f:
        version = yaml.safe_load(f)["version"]
    with open(os.path.join(TOP, "changelogs", "changelog.yaml"), encoding="utf-8") as f:
        released = (yaml.safe_load(f) or {}).get("releases") or {}
    summaries = []
    fragments = os.path.join(TOP, "changelogs", "fragments")
    for name in sorted(os.listdir(fragments)):
        with open(os.path.join(fragments, name), encoding="utf-8") as f:
            summary = (yaml.safe_load(f) or {}).get("release_summary")
        if summary:
            summaries.append((name, summary))
    if version in released:
        assert released[version]["changes"].get("release_summary")
    else:
        assert len(summaries) == 1, f"expected one release_summary fragment for {version}, found {summaries}"
    if "0.1.0" not in released:
        assert [name for name, _s in summaries] == ["0.1.0.yml"], "the first release's summary: changelogs/fragments/0.1.0.yml"


def _announced(release):
    return {
        "modules": sorted(m["name"] for m in release.get("modules", [])),
        "filters": sorted(p["name"] for p in release.get("plugins", {}).get("filter", [])),
        "roles": sorted(o["name"] for o in release.get("objects", {}).get("role", [])),
        "playbooks": sorted(o["name"] for o in release.get("objects", {}).get("playbook", [])),
    }


def _removed_features() -> str:
    """The text of every removed_features entry of the changelog fragments and of the released changelog."""
    texts = []
    fragments = os.path.join(TOP, "changelogs", "fragments")
    for name in sorted(os.listdir(fragments)):
        with open(os.path.join(fragments, name), encoding="utf-8") as f:
            texts += (yaml.safe_load(f) or {}).get("removed_features") or []
    with open(os.path.join(TOP, "changelogs", "changelog.yaml"), encoding="utf-8") as f:
        for release in ((yaml.safe_load(f) or {}).get("releases") or {}).values():
            texts += release.get("changes", {}).get("removed_features") or []
    return "\n".join(texts)


EVERYTHING = {"modules": MODULES, "filters": FILTERS, "roles": ROLES, "playbooks": PLAYBOOKS}
ANNOUNCED = ("a module, plugin or role is announced from its version_added (argument_specs.yml: the main entry point's"
             " version_added); a playbook from an 'add object.playbook' changelog fragment")


def test_the_release_announces_every_module_plugin_role_and_playbook(source_tree, tmp_path):
    """The version of galaxy.yml is released in changelogs/changelog.yaml (antsibull-changelog release), and with the
    releases before it announces everything the collection has; CHANGELOG.md/.rst are rendered from it; while it is not
    released yet, a dry release in a copy must do so."""
    with open(os.path.join(TOP, "galaxy.yml"), encoding="utf-8") as f:
        version = yaml.safe_load(f)["version"]
    with open(os.path.join(TOP, "changelogs", "changelog.yaml"), encoding="utf-8") as f:
        released = (yaml.safe_load(f) or {}).get("releases") or {}
    if version in released:
        releases = released
        tree = source_tree
    else:
        tree = tmp_path / "ansible_collections" / "gpuops" / "gpu"
        shutil.copytree(source_tree, tree, symlinks=True)
        home = tmp_path / "home"
        home.mkdir()
        run([tool("antsibull-changelog"), "release", "--date", "2000-01-01"], env=ansible_env(tmp_path / "none", home),
            cwd=str(tree))
        with open(tree / "changelogs" / "changelog.yaml", encoding="utf-8") as f:
            releases = yaml.safe_load(f)["releases"]
    # Each plugin is announced once, in the release of its version_added: together the releases announce everything.
    announced = {kind: sorted({n for r in releases.values() for n in _announced(r)[kind]}) for kind in EVERYTHING}
    # what an earlier release announced and the collection no longer has is named in a removed_features fragment
    removed = _removed_features()
    gone = {kind: [n for n in announced[kind] if n not in EVERYTHING[kind]] for kind in EVERYTHING}
    assert [n for names in gone.values() for n in names if n not in removed] == [], "removed without a removed_features entry"
    assert {kind: [n for n in announced[kind] if n in EVERYTHING[kind]] for kind in EVERYTHING} == EVERYTHING, ANNOUNCED
    assert releases[version]["changes"].get("release_summary")
    for out in ("CHANGELOG.md", "CHANGELOG.rst"):
        assert (tree / out).is_file()
        with open(tree / out, encoding="utf-8") as f:
            assert version in f.read().replace("\\", "")  # markdown escapes the dots: 0\.1\.0


def test_the_rendered_changelog_is_up_to_date(source_tree, tmp_path):
    """CHANGELOG.md is what antsibull-changelog renders from changelog.yaml (nobody edits it by hand)."""
    with open(os.path.join(TOP, "changelogs", "changelog.yaml"), encoding="utf-8") as f:
        if not (yaml.safe_load(f) or {}).get("releases"):
            pytest.skip("nothing released yet: there is no CHANGELOG to render")
    tree = tmp_path / "ansible_collections" / "gpuops" / "gpu"
    shutil.copytree(source_tree, tree, symlinks=True)
    home = tmp_path / "home"
    home.mkdir()
    run([tool("antsibull-changelog"), "generate"], env=ansible_env(tmp_path / "none", home), cwd=str(tree))
    for out in ("CHANGELOG.md", "CHANGELOG.rst"):
        with open(tree / out, encoding="utf-8") as f, open(os.path.join(TOP, out), encoding="utf-8") as g:
            assert f.read() == g.read(), f"{out} differs from what antsibull-changelog generate renders"


# --- 4. docs -------------------------------------------------------------------------------------

def test_antsibull_docs_lint(installed, user_env):
    env, cwd = user_env
    proc = run([tool("antsibull-docs"), "lint-collection-docs", "--plugin-docs", "--check-extra-docs-refs",
                "--validate-collection-refs", "all", "--disallow-unknown-collection-refs",
                installed / "ansible_collections" / "gpuops" / "gpu"], env=env, cwd=cwd, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "", proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr and "ERROR" not in proc.stderr, proc.stderr


def _pages():
    return ([f"{m}_module" for m in MODULES] + [f"{f}_filter" for f in FILTERS] + [f"{r}_role" for r in ROLES])


def test_antsibull_docs_renders_every_page_without_a_warning(user_env, tmp_path):
    """The pages as reStructuredText (simplified-rst: no Sphinx extension needed), each rendered to
    HTML by docutils with every warning an error."""
    from docutils.core import publish_string  # noqa: PLC0415 (docutils comes with antsibull-docs)

    env, cwd = user_env
    rst = tmp_path / "rst"
    rst.mkdir(mode=0o700)
    proc = run([tool("antsibull-docs"), "collection", "--use-current", "--fail-on-error", "--squash-hierarchy",
                "--output-format", "simplified-rst", "--dest-dir", rst, COLLECTION], env=env, cwd=cwd)
    assert "WARNING" not in proc.stdout + proc.stderr and "ERROR" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    for page in _pages() + ["index"]:
        path = rst / f"{page}.rst"
        assert path.is_file(), f"no page {path.name}: {sorted(p.name for p in rst.iterdir())}"
        warnings = io.StringIO()
        html = publish_string(path.read_text(encoding="utf-8"), source_path=str(path), writer="html5",
                              settings_overrides={"report_level": 2, "halt_level": 5, "warning_stream": warnings,
                                                  "output_encoding": "unicode"})
        assert warnings.getvalue() == "", f"{page}: {warnings.getvalue()}"
        assert 'class="system-message"' not in html
    index = (rst / "index.rst").read_text(encoding="utf-8")
    for page in _pages():
        assert page in index, f"{page} is not in the collection index"


def test_docs_build_script_builds_the_html_site(tmp_path):
    """docs/build.sh (the command the README gives), offline: antsibull-docs sphinx-init + Sphinx."""
    dest = tmp_path / "html"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(HOME=str(tmp_path), PATH=BIN + os.pathsep + env.get("PATH", ""), SPHINX_THEME="alabaster")
    proc = run(["bash", os.path.join(TOP, "docs", "build.sh"), "--offline", dest], env=env, cwd=str(tmp_path))
    for page in _pages() + ["index"]:
        html = dest / f"{page}.html"
        assert html.is_file(), f"no {html.name}: {sorted(p.name for p in dest.iterdir())}"
    facts = (dest / "gpu_facts_module.html").read_text(encoding="utf-8")
    assert "gpuops.gpu.gpu_facts" in facts and "gpu_devices" in facts
    assert "gpu_idle_release_grace_period" in (dest / "gpu_idle_role.html").read_text(encoding="utf-8")
    skipped = [ln for ln in proc.stdout.splitlines() if ln.startswith("not checked offline")]
    assert all("ansible_collections.gpuops" not in ln for ln in skipped), skipped


# --- 5. role README vs argument spec -------------------------------------------------------------

def _split_row(line):
    """Cells of a Markdown table row; a | inside `code` does not split."""
    cells, cell, code = [], "", False
    for ch in line.strip().strip("|"):
        if ch == "`":
            code = not code
        if ch == "|" and not code:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += ch
    cells.append(cell.strip())
    return cells


def _readme_variables(path):
    """{variable: {"type": cell, "default": cell}} from the README's variables table."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    tables = []
    for i, line in enumerate(lines):
        if not line.startswith("|"):
            continue
        header = [c.lower() for c in _split_row(line)]
        if header[:1] == ["variable"] and "default" in header and i + 1 < len(lines) and set(lines[i + 1]) <= set("|-: "):
            rows = {}
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                cells = dict(zip(header, _split_row(row)))
                name = cells["variable"].strip("`")
                assert name not in rows, f"{path}: {name} twice in the variables table"
                rows[name] = cells
            tables.append(rows)
    assert len(tables) == 1, f"{path}: expected one table with the columns variable ... default, found {len(tables)}"
    return tables[0]


def _readme_default(cell):
    cell = cell.strip()
    if cell.lower() in ("", "unset", "none", "-"):
        return None
    m = re.fullmatch(r"`([^`]*)`", cell)
    assert m, f"default {cell!r}: write it as `value` (YAML) or unset"
    return yaml.safe_load(m.group(1))


def _specs(role):
    with open(os.path.join(TOP, "roles", role, "meta", "argument_specs.yml"), encoding="utf-8") as f:
        return yaml.safe_load(f)["argument_specs"]


def _same_value(a, b):
    """Equal, with 300 and 300.0 the same number but true never the same as 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("role", ROLES)
def test_role_readme_agrees_with_argument_spec(role):
    specs = _specs(role)
    assert list(specs) == ["main"], "the README documents the main entry point only"
    options = specs["main"]["options"]
    table = _readme_variables(os.path.join(TOP, "roles", role, "README.md"))
    assert sorted(table) == sorted(options), (
        f"missing from README: {sorted(set(options) - set(table))}; not in argument_specs.yml: {sorted(set(table) - set(options))}")
    problems = []
    for name, spec in options.items():
        row = table[name]
        default = _readme_default(row["default"])
        if not _same_value(default, spec.get("default")):
            problems.append(f"{name}: README default {row['default']!r}, argument spec {spec.get('default')!r}")
        kind = row.get("type", "")
        if not kind.startswith(spec.get("type", "str")):
            problems.append(f"{name}: README type {kind!r}, argument spec {spec.get('type', 'str')!r}")
        if spec.get("elements") and f"of {spec['elements']}" not in kind:
            problems.append(f"{name}: README type {kind!r}, argument spec elements {spec['elements']!r}")
        for choice in spec.get("choices", []):
            if f"`{choice}`" not in kind:
                problems.append(f"{name}: README type {kind!r} does not list the choice {choice!r}")
    assert problems == []


@pytest.mark.parametrize("role", ROLES)
def test_role_defaults_agree_with_argument_spec(role):
    options = _specs(role)["main"]["options"]
    with open(os.path.join(TOP, "roles", role, "defaults", "main.yml"), encoding="utf-8") as f:
        defaults = yaml.safe_load(f) or {}
    assert sorted(set(defaults) - set(options)) == [], "defaults/main.yml sets variables the argument spec does not have"
    problems = []
    for name, spec in options.items():
        if name not in defaults:
            if spec.get("default") is not None:
                problems.append(f"{name}: default {spec['default']!r} in the argument spec, not in defaults/main.yml")
            continue
        value = defaults[name]
        if isinstance(value, str) and "{{" in value:
            continue  # a template (e.g. an inventory-wide variable first): checked by the role's tests
        if not _same_value(value, spec.get("default")):
            problems.append(f"{name}: defaults/main.yml {value!r}, argument spec {spec.get('default')!r}")
    assert problems == []


# --- 6. support matrix ---------------------------------------------------------------------------

def _core_version():
    import ansible.release  # noqa: PLC0415

    return ansible.release.__version__


# (controller Python, ansible-core requirement): each maintained ansible-core release (meta/runtime.yml's
# requires_ansible is the oldest of them) on a controller Python it accepts. ansible-core's published
# support dates: 2.17 ended Nov 2025, 2.18 May 2026, 2.19 Nov 2026; maintained: 2.20, 2.21, 2.22
# (controller Python 3.12+ for 2.20/2.21, 3.13-3.15 for 2.22). None: this virtual environment
# (requirements.txt's ansible-core on Python 3.12).
CONTROLLERS = [
    ("3.12", "ansible-core>=2.20,<2.21"),
    ("3.12", None),
    ("3.13", f"ansible-core=={_core_version()}"),
    ("3.13", "ansible-core>=2.22,<2.23"),
]
TARGETS = ["3.9", "3.10", "3.11", "3.12", "3.13", "3.14", "3.15"]


def _key(version, requirement):
    return f"{version}/{requirement or 'venv'}"


class Unpublished(Exception):
    """The ansible-core release is not on the package index this machine installs from."""


def _not_on_index(python, requirement):
    """The release's newest version on the package index, or a sentence saying there is none (pip index)."""
    name, sep, spec = requirement.partition(">=")
    if not sep:
        return ""
    proc = subprocess.run([python, "-m", "pip", "index", "versions", "--disable-pip-version-check", name.strip()],
                          capture_output=True, text=True, timeout=120, check=False)
    floor = spec.split(",")[0].strip()
    listed = re.findall(r"Available versions: (.*)", proc.stdout)
    versions = [v.strip() for v in listed[0].split(",")] if listed else []
    major_minor = ".".join(floor.split(".")[:2])
    if proc.returncode == 0 and not any(v == major_minor or v.startswith(major_minor + ".") for v in versions):
        return (f"ansible-core {major_minor} is not on the package index this machine reaches"
                f" (newest there: {versions[0] if versions else 'none'})")
    return ""


def _install_controller(python, requirement, dest):
    subprocess.run([python, "-m", "venv", dest], check=True, capture_output=True, timeout=120)
    proc = subprocess.run([os.path.join(dest, "bin", "python"), "-m", "pip", "install", "--quiet",
                           "--disable-pip-version-check", requirement], capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"pip install {requirement} on Python {python} exited {proc.returncode}: {proc.stderr[-3000:]}")
    return os.path.join(dest, "bin")


@pytest.fixture(scope="session")
def controllers(tmp_path_factory):
    """{python version: bin directory of a venv with that controller, or the exception}; built in parallel."""
    base = tmp_path_factory.mktemp("controllers")
    result = {}
    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        for version, requirement in CONTROLLERS:
            key = _key(version, requirement)
            if requirement is None:
                result[key] = BIN
                continue
            python = pyenv_python(version)
            if python is None:
                result[key] = None
                continue
            absent = _not_on_index(python, requirement)
            if absent:
                result[key] = Unpublished(absent)
                continue
            jobs[key] = pool.submit(_install_controller, python, requirement,
                                    str(base / f"py{version}-{len(jobs)}"))
        for key, job in jobs.items():
            try:
                result[key] = job.result()
            except Exception as exc:  # noqa: BLE001 (reported by the test that needs it)
                result[key] = exc
    return result


def _controller(controllers, version, requirement, record_property):
    """The bin directory of the controller (version, requirement), its ansible-core version recorded for the matrix
    (conftest.py prints it); a skip when this machine cannot have it."""
    found = controllers[_key(version, requirement)]
    if found is None:
        pytest.skip(f"no Python {version} on this machine (pyenv or PATH)")
    if isinstance(found, Unpublished):
        # Not a failure of the collection: the release is not published where this machine installs from.
        pytest.skip(str(found))
    if isinstance(found, Exception):
        pytest.fail(str(found), pytrace=False)
    if requirement is None and sys.version_info[:2] != tuple(int(x) for x in version.split(".")):
        pytest.skip(f"this venv runs Python {sys.version_info[0]}.{sys.version_info[1]}, not {version}")
    core = subprocess.run([os.path.join(found, "python"), "-c", "import ansible.release; print(ansible.release.__version__)"],
                          capture_output=True, text=True, timeout=60, check=False)
    record_property("ansible_core", core.stdout.strip() or f"unknown ({core.stderr.strip()[-200:]})")
    return found


def _oldest_target():
    for version in TARGETS:
        python = pyenv_python(version)
        if python:
            return version, python
    pytest.fail(f"no target Python of {TARGETS} on this machine", pytrace=False)
    return None


def _has_pynvml(python):
    return subprocess.run([python, "-c", "import pynvml"], capture_output=True, check=False).returncode == 0


FACTS_PLAY = """\
---
- name: GPU facts on the oldest target Python
  hosts: gpuhost
  gather_facts: false
  tasks:
    - name: The target's Python
      ansible.builtin.setup:
        gather_subset: ['!all', '!min', python]
    - name: Gather GPU facts
      gpuops.gpu.gpu_facts:
        device_files: ["{simdir}/dev/nvidia*"]
    - name: Save them
      ansible.builtin.copy:
        dest: "{out}"
        content: "{{{{ {{'python': ansible_facts.python.version, 'driver': ansible_facts.gpu_driver,
                       'count': ansible_facts.gpu_count, 'devices': ansible_facts.gpu_devices}} | to_json }}}}"
        mode: "0600"
      delegate_to: localhost
"""


@pytest.mark.parametrize("version,requirement", CONTROLLERS, ids=[f"controller-py{v}-{r or 'venv'}" for v, r in CONTROLLERS])
def test_controller_runs_gpu_facts_on_the_oldest_target(controllers, version, requirement, installed, gpusim, tmp_path,
                                                        record_property):
    bindir = _controller(controllers, version, requirement, record_property)
    target_version, target = _oldest_target()
    expected_backend = "nvml" if _has_pynvml(target) else "nvidia-smi"
    pid = gpusim.hold(gpus=[3], mib=20480)

    home = tmp_path / "home"
    home.mkdir()
    out = tmp_path / "facts.json"
    (tmp_path / "inventory.yml").write_text(
        f"all:\n  hosts:\n    gpuhost:\n      ansible_connection: local\n      ansible_python_interpreter: {target}\n"
        f"    localhost:\n      ansible_connection: local\n      ansible_python_interpreter: {os.path.join(bindir, 'python')}\n")
    (tmp_path / "play.yml").write_text(FACTS_PLAY.format(simdir=gpusim.dir, out=out))
    env = ansible_env(installed, home, extra=gpusim.env_vars())
    env["PATH"] = bindir + os.pathsep + env["PATH"]
    proc = run([os.path.join(bindir, "ansible-playbook"), "-i", tmp_path / "inventory.yml", tmp_path / "play.yml"],
               env=env, cwd=str(tmp_path))
    assert warnings_in(proc.stdout + proc.stderr) == [], proc.stdout[-3000:]
    version_out = run([os.path.join(bindir, "ansible-playbook"), "--version"], env=env).stdout
    assert f"python version = {version}." in version_out, version_out
    release = requirement.split(">=")[-1].split(",")[0].split("==")[-1] if requirement else _core_version()
    assert f"[core {'.'.join(release.split('.')[:2])}." in version_out, version_out

    facts = json.loads(out.read_text())
    assert facts["python"]["major"] == 3 and f"{facts['python']['major']}.{facts['python']['minor']}" == target_version
    assert facts["driver"]["backend"] == expected_backend
    assert facts["count"] == 8 and [d["index"] for d in facts["devices"]] == list(range(8))
    gpu3 = facts["devices"][3]
    procs = {p["pid"]: p for p in gpu3["processes"]}
    assert pid in procs, gpu3
    assert procs[pid]["used_mib"] == 20480
    assert gpu3["memory"]["used"] >= 20480 and gpu3["idle"] is False
    assert pid in {p for pids in gpu3["holders"].values() for p in pids}
    assert all(d["idle"] for d in facts["devices"] if d["index"] != 3)


@pytest.mark.parametrize("version,requirement", [c for c in CONTROLLERS if c[1] is not None],
                         ids=[f"controller-py{v}-{r}" for v, r in CONTROLLERS if r is not None])
def test_controller_reads_the_docs_and_the_playbooks(controllers, version, requirement, installed, tmp_path, record_property):
    bindir = _controller(controllers, version, requirement, record_property)
    home = tmp_path / "home"
    home.mkdir()
    env = ansible_env(installed, home)
    env["PATH"] = bindir + os.pathsep + env["PATH"]
    doc = os.path.join(bindir, "ansible-doc")
    for plugin_type, names in (("module", MODULES), ("filter", FILTERS), ("role", ROLES)):
        proc = run([doc, "-t", plugin_type, "--json"] + [f"{COLLECTION}.{n}" for n in names], env=env, cwd=str(tmp_path))
        assert sorted(json.loads(proc.stdout)) == [f"{COLLECTION}.{n}" for n in names]
        assert warnings_in(proc.stderr) == []
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(INVENTORY.format(python=os.path.join(bindir, "python")))
    for playbook in PLAYBOOKS:
        proc = run([os.path.join(bindir, "ansible-playbook"), f"{COLLECTION}.{playbook}", "-i", inventory, "--syntax-check"],
                   env=env, cwd=str(tmp_path))
        assert warnings_in(proc.stdout + proc.stderr) == []
