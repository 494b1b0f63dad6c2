"""rules/edge/dodo_tasks.py: the doit task dicts made from Targets (compile, family group, package), checked
without compiling."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from doit.loader import generate_tasks

from kforge.store import artifact
from kforge.ship import package
from kforge.edge import dodo_tasks
from kforge.plan.catalog import load_specs
from kforge.store.inputs import InputIndex
from kforge.base.layout import Layout
from kforge.plan.targets import build_targets
from tests.support import doit, make_project, spec_text

ARCHS = ("sm_90a", "gfx942")


@pytest.fixture
def project(tmp_path):
    specs = {"scale": spec_text(archs=ARCHS, blocks=(128, 256)),
             "twice": spec_text(name="twice", archs=ARCHS)}
    return make_project(tmp_path / "p", specs=specs)


@pytest.fixture
def targets(project):
    return build_targets(load_specs(project), project, None)


@pytest.fixture
def index(tmp_path):
    return artifact.KeyIndex(tmp_path / "built-keys.json")


def fake_artifact(target, key=None, inputs=()):
    """An artifact on disk that the key index takes as built from `key` (no ELF checks at this level), its
    compile having read `inputs` ([name, sha256] pairs; None: an artifact that records none)."""
    binary = b"pretend code"
    out = Path(target.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "k.cubin").write_bytes(binary)
    (out / "meta.json").write_text(json.dumps({"key": key or target.key, "binary": "k.cubin",
                                               "sha256": artifact.sha256(binary),
                                               **({} if inputs is None else {"inputs": list(inputs)})}))


def test_a_compile_tasks_doit_name_is_the_targets_name(targets, project, index):
    t = targets[0]
    d = dodo_tasks.compile_task(t, str(project), 60.0, index)
    assert f"{d['basename']}:{d['name']}" == t.name == f"{t.kernel}:{t.config_id}@{t.arch}"
    made = generate_tasks(t.kernel, (x for x in [d]))   # doit adds a group task named after the basename
    assert [task.name for task in made] == [t.kernel, t.name]


def test_a_compile_task_has_no_file_dep_targets_or_clean_actions(targets, project, index):
    """Less for doit to process per task on a no-op run: forget, clean and prune go through the Target."""
    for t in targets:
        d = dodo_tasks.compile_task(t, str(project), 60.0, index)
        assert not d.get("file_dep") and not d.get("targets") and not d.get("clean")


def test_a_compile_task_runs_compile_target_with_the_target_root_timeout_caches_and_executor(targets, project, index,
                                                                                          monkeypatch):
    t = targets[0]
    cache, local = object(), object()
    d = dodo_tasks.compile_task(t, str(project), 12.5, index, cache, "dask://h:1", local)
    [(action, args)] = d["actions"]
    assert args == [t, str(project), 12.5, cache, "dask://h:1", local]
    from kforge.compile import action as build
    monkeypatch.setattr(build, "compile_target", lambda *given: {"called with": given})
    assert action(*args) == {"called with": tuple(args)}   # the action is compile_target, imported when it runs


def test_a_compile_task_is_up_to_date_exactly_when_the_key_index_finds_its_key_on_disk(targets, project, index):
    t, other = targets[0], targets[1]
    assert dodo_tasks.compile_task(t, str(project), 60.0, index)["uptodate"] == [False]
    fake_artifact(t)
    fake_artifact(other, key="a key from another build")
    assert dodo_tasks.compile_task(t, str(project), 60.0, index)["uptodate"] == [True]
    assert dodo_tasks.compile_task(other, str(project), 60.0, index)["uptodate"] == [False]
    assert index.changed   # what it read is remembered for the reporter to save


def test_a_compile_task_is_stale_when_a_file_its_compile_read_has_other_content(targets, project, index):
    t = targets[0]
    data = project / "tk" / "table.json"
    data.write_text("[1, 2]")
    fake_artifact(t, inputs=[["tk/table.json", artifact.sha256(b"[1, 2]")]])
    read = InputIndex(project / "a.json", project)
    assert dodo_tasks.compile_task(t, str(project), 60.0, index, read=read)["uptodate"] == [True]
    data.write_text("[1, 3]")
    read = InputIndex(project / "b.json", project)
    assert dodo_tasks.compile_task(t, str(project), 60.0, index, read=read)["uptodate"] == [False]
    fake_artifact(t, inputs=None)   # built before inputs were recorded: nothing says what it read, so it rebuilds
    read = InputIndex(project / "c.json", project)
    assert dodo_tasks.compile_task(t, str(project), 60.0, index, read=read)["uptodate"] == [False]


def test_a_compile_tasks_meta_carries_the_target(targets, project, index):
    t = targets[0]
    assert dodo_tasks.compile_task(t, str(project), 60.0, index)["meta"] == {"kforge_target": t}


def catalog_of(targets, **descriptions):
    """What compile_tasks reads of a Catalog: its families (name, description), targets and broken families."""
    families = [SimpleNamespace(name=name, description=descriptions.get(name, ""))
                for name in dict.fromkeys(t.kernel for t in targets)]
    return SimpleNamespace(families=families, targets=targets, broken=[])


def test_a_family_is_a_group_task_over_its_compile_tasks(targets, project):
    scale = [t for t in targets if t.kernel == "scale"]
    made = generate_tasks("scale", dodo_tasks.compile_tasks(project, catalog_of(scale)))
    group, *compiles = made
    assert group.name == "scale" and not group.actions and group.doc == "all scale targets"
    assert group.task_dep == [t.name for t in scale] == [c.name for c in compiles]
    assert all(c.subtask_of == "scale" for c in compiles)
    assert len(scale) == 4


def test_a_familys_description_is_its_group_tasks_doc(targets, project):
    twice = [t for t in targets if t.kernel == "twice"]
    first = next(dodo_tasks.compile_tasks(project, catalog_of(twice, twice="doubles things")))
    assert first == {"basename": "twice", "name": None, "doc": "doubles things"}


def test_there_is_one_package_task_per_arch_after_every_compile_task_of_that_arch(targets, project):
    made = {t.name: t for t in generate_tasks("package", dodo_tasks.package_tasks(targets, str(project)))}
    assert sorted(made) == ["package", "package:gfx942", "package:sm_90a"]
    assert sorted(made["package"].task_dep) == ["package:gfx942", "package:sm_90a"]
    for arch in ARCHS:
        mine = [t for t in targets if t.arch == arch]
        assert {t.kernel for t in mine} == {"scale", "twice"} and len(mine) == 3
        assert made[f"package:{arch}"].task_dep == [t.name for t in mine]


def test_a_package_task_runs_after_failed_deps_and_targets_the_manifest_copy(targets, project):
    dicts = list(dodo_tasks.package_tasks(targets, str(project)))[1:]
    assert [d["name"] for d in dicts] == sorted(ARCHS)
    for d in dicts:
        arch = d["name"]
        mine = [t for t in targets if t.arch == arch]
        assert d["meta"] == {"after_failed_deps": True}
        assert d["targets"] == [str(Layout(project).manifest_copy(arch))]
        assert d["actions"] == [(package.build_bundle, [arch, mine, str(project), [], []])]
        assert d["uptodate"] == [(package.is_current, [arch, mine, str(project), [], []])]
        assert d["clean"] == [(package.remove, [arch, str(project)])]


def test_each_package_task_gets_its_archs_autotune_picks(targets, project):
    picks = [{"kernel": "m:k", "arch": a, "key": [a], "config": {"B": a}, "lines": 2} for a in ("sm_90a", "gfx942")]
    for d in list(dodo_tasks.package_tasks(targets, str(project), picks))[1:]:
        mine = [{"kernel": "m:k", "key": [d["name"]], "config": {"B": d["name"]}, "lines": 2}]
        assert d["actions"][0][1][3] == (mine if d["name"] in ("sm_90a", "gfx942") else [])


def test_no_targets_make_only_the_package_group_task(project):
    assert [d["name"] for d in dodo_tasks.package_tasks([], str(project))] == [None]


@pytest.mark.parametrize("saved", [{"files": []}, {"files": {"x": 7}, "sets": {}, "targets": {}},
                                   {"files": {}, "sets": {"s": [[1, 2]]}, "targets": {}},
                                   {"files": {}, "sets": {}, "targets": {"m": 3}}])
def test_an_input_index_of_another_shape_is_dropped_with_one_warning(targets, project, index, saved, capsys):
    """Another kforge's or a restored CI cache's out/.kforge/observed-inputs.json: never a traceback."""
    t = targets[0]
    data = project / "tk" / "table.json"
    data.write_text("[1, 2]")
    fake_artifact(t, inputs=[["tk/table.json", artifact.sha256(b"[1, 2]")]])
    from kforge.load import observe
    kept = project / "kept.json"   # the folders this project's names resolve in: only the shape is wrong
    kept.write_text(json.dumps({**saved, "folders": list(observe.search_path(str(project)))}))
    read = InputIndex(kept, project)
    assert dodo_tasks.compile_task(t, str(project), 60.0, index, read=read)["uptodate"] == [True]
    warned = capsys.readouterr().err.strip().splitlines()
    assert len(warned) == 1 and "is not in the shape this kforge writes; it is dropped and rebuilt" in warned[0]


def test_an_arch_asked_for_that_no_family_builds_is_one_line_and_exit_2(tmp_path):
    """`doit archs=sm_100a` on a catalog whose families build sm_90a and gfx942 selected 0 targets, said nothing
    and exited 0: a CI job asking for an arch shipped no bundle for it (an outside review with torchao)."""
    root = make_project(tmp_path, specs={"scale": spec_text(archs=("sm_90a", "gfx942"))})
    for args in (("archs=sm_100a",), ("archs=sm_90a,sm_100a", "list")):
        refused = doit(root, *args, check=False)
        assert refused.returncode == 2 and refused.stderr.splitlines()[-1] == (
            f"kforge: {args[0]}: no family builds sm_100a; add it to a spec's archs (`doit list --all` without "
            f"archs= shows each target's arch), or leave it out"), refused.stderr
    assert not (root / "out" / "sm_90a").exists()
    doit(root, "archs=gfx942")   # an arch a family builds: built
    assert (root / "out" / "gfx942").is_dir()


def test_a_family_named_as_a_task_of_the_projects_dodo_py_is_one_line_and_the_rest_builds(tmp_path):
    """`name = "verify_dispatch_combine"` (this repository's dodo.py task) loaded: `doit list` showed the name twice
    and every doit run stopped at doit's `ERROR: Task names must be unique`, exit code 3, naming neither the spec
    nor the fix. Now that family is one broken entry naming its spec and the clash; the project's task and the
    rest of the catalog are as they were."""
    root = make_project(tmp_path, specs={"scale": spec_text(), "hello": spec_text(name="hello")})
    with open(root / "dodo.py", "a") as f:
        f.write("\n\ndef task_hello():\n    return {'actions': ['echo hello from the project'], 'verbosity': 2}\n")
        # an attribute named like a task binds no task: the family `scale` still loads (a review)
        f.write("\nimport types\nif False:\n    types.task_scale\n")
    line = ("family hello_broken did not load: specs/hello.toml: [kernel] name: 'hello' is the name of a task the "
            "project's dodo.py defines (task_hello); choose another, e.g. 'hello_kernel'")
    listed = doit(root, "list", check=False)
    assert listed.returncode == 0 and listed.stderr == f"kforge: {line}\n", listed.stderr
    assert [row.split()[0] for row in listed.stdout.splitlines()] == ["hello", "hello_broken", "package", "scale",
                                                                         "tune"]
    built = doit(root, "-n", "1", "scale", check=False, timeout=300)
    assert built.returncode == 0 and (root / "out" / "sm_90a" / "scale").is_dir(), built.stderr
    assert "hello from the project" in doit(root, "hello").stdout
    every = doit(root, "-n", "1", check=False, timeout=300)   # the broken family fails, the rest is up to date
    assert every.returncode == 1 and "ERROR" not in every.stderr and "hello_broken failed with: specs/hello.toml" in every.stdout


def test_a_family_that_did_not_load_is_named_apart_from_the_projects_own_tasks(tmp_path):
    """A broken family named as a task of the project's dodo.py was listed under that name: two tasks of one name,
    and every doit run stopped at doit's "Task names must be unique" (a critical read)."""
    from tests import tune_library
    from tests.plan.test_catalog import BROKEN_MODULES, library_spec
    site = tune_library.install(tmp_path / "site", {"nodevice": BROKEN_MODULES["nodevice"]})
    root = make_project(tmp_path / "p", specs={"scale": spec_text(), "lint": library_spec("lint", "nodevice")})
    with open(root / "dodo.py", "a") as f:
        f.write("\n\ndef task_lint():\n    return {'actions': ['echo lint from the project'], 'verbosity': 2}\n")
    listed = doit(root, "list", env={"PYTHONPATH": str(site)}, check=False)
    assert listed.returncode == 0, listed.stderr
    assert [row.split()[0] for row in listed.stdout.splitlines()] == ["lint", "lint_broken", "package", "scale",
                                                                         "tune"]
    assert "lint from the project" in doit(root, "lint", env={"PYTHONPATH": str(site)}).stdout


def test_a_family_that_did_not_load_names_the_fix_not_a_retry_that_fails_the_same_way(tmp_path):
    """A broken family's failure said `retry alone: doit bad` and the summary `retry one alone: doit bad`: that run
    loads the same spec and fails the same way. Now the hint says to edit the spec named above it (or the file its
    error names), then run again; the line keeps the reporter's 'retry alone:' prefix, so the error line stops
    above it and the summary takes the hint as the failure's own."""
    from tests.support import build_report
    root = make_project(tmp_path, specs={"scale": spec_text(), "bad": "[kernel\nname = 'x'\n"})
    cause = "specs/bad.toml: not valid TOML: Expected ']' at the end of a table declaration (at line 1, column 8)"
    hint = ("edit specs/bad.toml (or the file the error names) to fix it, then run doit bad again; unchanged, it "
            "fails the same way")
    failed = dodo_tasks.did_not_load("bad", "specs/bad.toml", cause)
    assert failed.get_msg().splitlines()[-1] == f"  retry alone: {hint}"
    run = doit(root, "-n", "1", check=False, timeout=300)
    assert run.returncode == 1 and build_report(root)["bad"] == "failed", run.stdout
    [record] = [t for t in json.loads((root / "out" / "build-report.json").read_text())["tasks"] if t["name"] == "bad"]
    assert record["cause"] == cause and record["error"].endswith(f"\n  retry alone: {hint}")
    assert f"kforge: bad failed with: {cause}\n  to retry: {hint}\n" in run.stdout, run.stdout
    assert "doit bad\n" not in run.stdout
