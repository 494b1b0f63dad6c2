"""kforge's doit commands as a user types them: info, clean, prune (forget: tests/compile/test_action.py)."""
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from kforge.edge import commands
from kforge.store import guard
from tests.support import built_once, copy_built, doit, make_project, spec_text, statuses

BLOCKS = (64, 128, 256)
NAMES = {f"scale:fp16-b{b}-w4@sm_90a" for b in BLOCKS}


def _build_three(root):
    make_project(root, specs={"scale": spec_text(blocks=BLOCKS)})
    doit(root, "-n", "2")
    assert statuses(root, "built") == NAMES


@pytest.fixture
def project(tmp_path_factory, tmp_path):
    """Three targets built once for the run; each test changes a copy of them."""
    return copy_built(built_once(tmp_path_factory, "commands-three-blocks", _build_three), tmp_path / "p")


def test_info_of_a_target_shows_what_kforge_knows_and_nothing_internal(project):
    out = doit(project, "info", "scale:fp16-b128-w4@sm_90a").stdout
    assert "spec: specs/scale.toml" in out and "triton entry: tk.scale.scale_kernel" in out
    assert "config: {'dtype': 'fp16', 'BLOCK': 128, 'num_warps': 4}" in out
    assert "artifact: out/sm_90a/scale/fp16-b128-w4/" in out and "state: up to date" in out
    assert "key: " in out and "kforge_compile" not in out and "meta" not in out
    (project / "tk" / "scale.py").write_text((project / "tk" / "scale.py").read_text().replace("* 2", "* 3"))
    assert "state: stale" in doit(project, "info", "scale:fp16-b128-w4@sm_90a").stdout


def test_info_of_a_family_lists_its_targets_and_counts_states(project):
    (project / "out/sm_90a/scale/fp16-b64-w4/meta.json").unlink()
    out = doit(project, "info", "scale").stdout
    assert "scale:fp16-b64-w4@sm_90a  not built" in out and "scale:fp16-b256-w4@sm_90a  up to date" in out
    assert out.rstrip().endswith("scale: 3 targets: 1 not built, 2 up to date")
    assert "no dependencies" not in out


def test_info_of_an_unknown_name_is_one_clear_error(project):
    bad = doit(project, "info", "scael", check=False)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "no target or family named 'scael'; did you mean scale?; `doit list --all` lists every target" in bad.stderr
    # a target's arch mistyped: the closest targets, not every family (an outside review: 41 families listed)
    typo = doit(project, "info", "scale:fp16-b64-w4@sm_90", check=False).stderr
    assert "no target or family named 'scale:fp16-b64-w4@sm_90'; did you mean scale:fp16-b64-w4@sm_90a" in typo
    far = doit(project, "info", "zzzz", check=False).stderr
    assert "no target or family named 'zzzz'; families: scale; `doit list --all` lists every target" in far


def test_clean_prints_one_line_and_leaves_no_empty_directories(project):
    proc = doit(project, "clean", "scale")
    assert proc.stdout.strip() == "kforge: removed 3 artifacts from out/"
    assert not (project / "out" / "sm_90a").exists()   # emptied, so removed; out/ itself stays
    assert (project / "out").is_dir()
    one = doit(project, "clean", "scale:fp16-b64-w4@sm_90a").stdout
    assert one.strip() == "kforge: removed 0 artifacts from out/"


def test_prune_removes_exactly_the_artifacts_of_no_target_and_the_build_says_so(project):
    (project / "specs" / "scale.toml").write_text(spec_text(blocks=(128,)))
    summary = doit(project).stdout
    assert "kforge: 2 artifacts in out/ belong to no target: `doit prune` removes them" in summary
    assert doit(project, "prune").stdout.strip() == "kforge: pruned 2 artifacts that belonged to no target"
    assert sorted(os.listdir(project / "out/sm_90a/scale")) == ["fp16-b128-w4"]
    assert "nothing to prune" in doit(project, "prune").stdout
    assert "belong to no target" not in doit(project).stdout


def test_prune_deletes_only_what_kforge_wrote(project):
    """A user's folder at an artifact's place (a saved profile: no meta.json, no error.txt) is not an artifact:
    prune keeps it and says so, and the build does not count it as one."""
    (project / "specs" / "scale.toml").write_text(spec_text(blocks=(128,)))
    profile = project / "out/sm_90a/scale/my-profile"
    profile.mkdir()
    (profile / "run.ncu-rep").write_text("mine")
    assert "kforge: 2 artifacts in out/ belong to no target" in doit(project).stdout
    out = doit(project, "prune").stdout.splitlines()
    assert out == ["kforge: pruned 2 artifacts that belonged to no target",
                   "kforge: kept 1 entry at artifacts' places that kforge did not write (no meta.json or error.txt): "
                   "out/sm_90a/scale/my-profile"]
    assert (profile / "run.ncu-rep").read_text() == "mine"


def test_clean_deletes_only_what_kforge_wrote(project):
    mine = project / "out/sm_90a/scale/fp16-b64-w4"
    for name in os.listdir(mine):   # the artifact's place now holds a user's files only
        (mine / name).unlink()
    (mine / "notes.txt").write_text("mine")
    out = doit(project, "clean", "scale").stdout.splitlines()
    assert out == ["kforge: removed 2 artifacts from out/",
                   "kforge: refused: kept out/sm_90a/scale/fp16-b64-w4: kforge did not write it (no meta.json or "
                   "error.txt); delete it yourself if it is not yours"]
    assert (mine / "notes.txt").read_text() == "mine"


def test_prune_and_clean_never_follow_a_symlink_out_of_out(project, tmp_path):
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    (project / "out/sm_90a/scale/evil").symlink_to(outside)   # a link at an artifact's place: not kforge's
    (project / "out/gfx942").symlink_to(outside, target_is_directory=True)   # an arch dir that is a link
    assert "nothing to prune" in doit(project, "prune").stdout
    assert (outside / "keep.txt").read_text() == "mine" and (project / "out/sm_90a/scale/evil").is_symlink()
    with pytest.raises(guard.OutsideOut):
        guard.remove_artifact_dir(project / "out", project / "out" / "gfx942" / "scale" / "x")
    with pytest.raises(guard.OutsideOut):
        guard.remove_artifact_dir(project / "out", outside)
    assert (outside / "keep.txt").exists()


def test_forget_refuses_another_backend_in_one_line_and_leaves_nothing_that_clean_or_prune_take_for_a_users_folder(
        project):
    """`doit forget --backend sqlite3` is one clear error and forgets nothing. forget deleted meta.json and error.txt
    and kept the binary: the folder then held kforge's file alone, and clean refused it as 'kforge did not write it'
    (prune, once its config was dropped, kept and named it)."""
    bad = doit(project, "forget", "--backend", "sqlite3", "scale:fp16-b64-w4@sm_90a", check=False)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "doit forget needs the backend 'kforge-sqlite' (dodo.py's DOIT_CONFIG), not SqliteDB" in bad.stderr
    assert (project / "out/sm_90a/scale/fp16-b64-w4/meta.json").exists()
    doit(project, "forget", "scale:fp16-b64-w4@sm_90a")
    assert not (project / "out/sm_90a/scale/fp16-b64-w4").exists()
    assert (project / "out/sm_90a/scale/fp16-b128-w4/meta.json").exists()
    out = doit(project, "clean", "scale").stdout
    assert out.strip() == "kforge: removed 2 artifacts from out/", out
    doit(project)
    doit(project, "forget", "scale")
    (project / "specs" / "scale.toml").write_text(spec_text(blocks=(128,)))
    assert doit(project, "prune").stdout.strip() == "kforge: nothing to prune: every artifact in out/ belongs to a target"
    assert not (project / "out/sm_90a").exists()


def test_forget_of_a_broken_family_loads_it_again_where_its_failure_was_replayed(tmp_path):
    """A family whose module's import failed is replayed unprobed while what the import read holds; `doit forget
    NAME` is the way to load it again, as the replayed line says (a fix the import never read: a system library)."""
    from tests import tune_library
    from tests.plan.test_catalog import BROKEN_MODULES, library_spec
    site = tune_library.install(tmp_path / "site", {"nodevice": BROKEN_MODULES["nodevice"]})
    root = make_project(tmp_path / "p", specs={"scale": spec_text(), "lib": library_spec("lib", "nodevice")})
    env = {"PYTHONPATH": str(site)}
    said = [[line for line in doit(root, "list", env=env).stderr.splitlines() if "did not load" in line]
            for _ in range(2)]
    assert [len(s) for s in said] == [1, 1] and said[1][0] == said[0][0] + (
        " (replayed: it failed so from these inputs before; `doit forget lib` loads it again)")
    assert doit(root, "forget", "scale", env=env).returncode == 0   # another family's forget keeps it
    assert "(replayed" in doit(root, "list", env=env).stderr
    assert doit(root, "forget", "lib", env=env).returncode == 0
    assert [line for line in doit(root, "list", env=env).stderr.splitlines() if "did not load" in line] == said[0]


def test_kforges_commands_from_another_folder_or_with_an_empty_argument_refuse_in_one_line_and_change_nothing(
        project, tmp_path):
    """doit reads plugin commands from the pyproject.toml where it starts: `doit -f PROJ/dodo.py forget T` from
    another folder was doit's own forget (nothing rebuilt after it) and clean did nothing; prune and cache were
    task names doit did not know, three lines naming no fix. doit reads `name=value` settings off the command line
    before any command runs, indexing each argument's first character: `doit info ''` (a script's unset variable)
    was an IndexError traceback from doit's parser. Neither changes anything: one build after all of them finds
    every target up to date."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = "scale:fp16-b64-w4@sm_90a"
    spaced = project.rename(project.with_name("my project"))   # the folder as `cd` takes it: quoted
    for command, *names in (["forget", target], ["clean", target], ["info", target], ["prune"], ["cache"]):
        proc = doit(elsewhere, "-f", str(spaced / "dodo.py"), command, *names, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip() == (f"kforge: `doit {command}` ran doit's own command, not kforge's: doit takes "
                                       f"kforge's commands from [tool.doit.plugins.command] in the pyproject.toml of "
                                       f"the folder it starts in; start it in '{spaced.resolve()}', or name them in "
                                       f"that pyproject.toml as README shows"), proc.stderr
    project = spaced.rename(project)
    for args in (["info", ""], ["forget", ""], ["clean", ""], ["list", ""], ["prune", ""], ["cache", ""], [""],
                 ["info", "scale", ""], ["clean", " "], ["forget", "\t"], ["-n", "2", ""]):
        proc = doit(project, *args, check=False)
        assert proc.returncode == 3 and "Traceback" not in proc.stderr + proc.stdout, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("kforge: `doit "), (args, proc.stderr)
        assert "is empty: it names no task, target or setting" in proc.stderr, proc.stderr
    assert all((project / f"out/sm_90a/scale/fp16-b{b}-w4/meta.json").exists() for b in BLOCKS)
    assert "up to date 3" in doit(project).stdout


def test_a_pyproject_naming_the_commands_old_module_gets_one_line_with_the_fix(project):
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("kforge.edge.commands:", "kforge.doit_commands:"))
    proc = doit(project, "forget", "scale:fp16-b64-w4@sm_90a", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("kforge: pyproject.toml's [tool.doit.plugins.command] names kforge.doit_commands, "
                                  "which is now kforge.edge.commands")
    assert (project / "out/sm_90a/scale/fp16-b64-w4/meta.json").exists()


@pytest.mark.parametrize("command", ["prune", "cache"])
def test_a_command_that_takes_no_name_refuses_one_in_one_line(project, command):
    """`doit prune scale` pruned every family's orphans (the name was dropped without a word)."""
    (project / "specs" / "scale.toml").write_text(spec_text(blocks=(128,)))
    proc = doit(project, command, "scale", check=False)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert f"kforge: doit {command} takes no target or family (given: 'scale')" in proc.stderr, proc.stderr
    assert len(os.listdir(project / "out/sm_90a/scale")) == 3


STATE = (".kforge/built-keys.json", ".kforge/observed-inputs.json", ".kforge/tools.json", ".kforge/catalog.json",
         ".kforge/package-sm_90a.json", "sm_90a/scale/fp16-b64-w4/meta.json", "sm_90a/scale/fp16-b128-w4/error.txt",
         "sm_90a/scale/fp16-b256-w4/scale_kernel.cubin")


@pytest.mark.parametrize("how", ["fifo", "link out of out/", "another shape", "binary", "folder", "too big"])
def test_every_state_file_kforge_reads_is_dropped_with_one_warning_and_rebuilt(project, tmp_path, how):
    """out/ from another kforge version, a restored CI cache or a hostile archive: a FIFO at a state file's place
    hung every command; a link out of out/ was read through; JSON of another shape or a damaged file was dropped
    without a word (tools.json's {path: 7} even went into every key as ptxas' version)."""
    outside = tmp_path / "outside.json"
    outside.write_text('{"mine": true}')
    out = project / "out"
    for rel in STATE:
        path = out / rel
        if path.exists():
            path.unlink()
        if how == "fifo":
            os.mkfifo(path)
        elif how == "link out of out/":
            path.symlink_to(outside)
        elif how == "another shape":
            path.write_text('{"files": [], "recent": 7, "stamp": [1], "/x": 7}')
        elif how == "binary":
            path.write_bytes(bytes(range(256)) * 4)
        elif how == "folder":
            path.mkdir()
        else:
            with open(path, "wb") as f:
                f.truncate(300 << 20)   # sparse: 300 MiB of zeros
    said = ""
    for args in (("info", "scale:fp16-b64-w4@sm_90a"), ("list", "--all"), ("prune",), ()):
        proc = doit(project, *args, check=False, timeout=120)
        said += proc.stdout + proc.stderr
        assert "Traceback" not in said and proc.returncode == 0, (args, said[-3000:])
    for rel in STATE:   # kforge's own state: one warning; an artifact's file: its target rebuilds
        named = sum(rel in line for line in said.splitlines())
        assert named == 1 if rel.startswith(".kforge/") else named <= 1, (rel, said[-3000:])
    assert outside.read_text() == '{"mine": true}'
    again = doit(project)
    assert "up to date 3" in again.stdout and "built 0" in again.stdout, again.stdout
    assert "warning" not in again.stdout + again.stderr and "dropped" not in again.stdout + again.stderr
    # replaced by what the run wrote (an error.txt beside a current artifact is not read, and stays as it is)
    assert not any(os.path.islink(out / rel) for rel in STATE if not rel.endswith("error.txt"))


def test_info_never_prints_a_state_files_control_characters(project):
    """error.txt is read back from out/ (a restored cache, an archive): its bytes reach the terminal only as text."""
    place = project / "out/sm_90a/scale/fp16-b64-w4"
    (place / "meta.json").unlink()
    (place / "error.txt").write_bytes(b"key: 0\nerror: \x1b]0;owned\x07\x1b[2J gone\r\x00\xff\n")
    out = doit(project, "info", "scale:fp16-b64-w4@sm_90a").stdout
    state = next(line for line in out.splitlines() if line.startswith("  state:"))
    assert state.isprintable() and "gone" in state, repr(state)


@pytest.mark.parametrize("args", [["-f", ""], ["-f", "."], ["-f", "specs"], ["-f", "specs/scale.toml"], ["-d", ""]])
def test_a_dodo_file_or_folder_option_that_names_no_dodo_py_is_one_line(project, args):
    """`doit -f "$DODO"` with DODO unset, or a folder, ran nothing and exited 0; a file not named .py was doit's
    ModuleNotFoundError traceback."""
    proc = doit(project, *args, check=False)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, (args, proc.stderr)
    # an empty value stops at kforge's start-up line (site-packages' .pth), before doit parses anything
    said = f"kforge: `doit {args[0]} ''`: argument 2 is empty" if args[1] == "" else f"kforge: doit {args[0]} "
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(said), proc.stderr


def test_a_fifo_among_the_specs_is_one_broken_family_not_a_hang(project):
    """A FIFO named specs/*.toml was refused, and then opened to name the family that did not load: every command
    hung."""
    os.mkfifo(project / "specs" / "evil.toml")
    proc = doit(project, "list", check=False, timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "evil  " in proc.stdout and "specs/evil.toml: not a regular file" in proc.stdout, proc.stdout


@pytest.mark.parametrize("part", ["constexprs", "toolchain_versions", "env", "source"])
@pytest.mark.parametrize("value", [7, [], None, "x", [["a", 1]]])
def test_info_of_a_meta_json_of_another_shape_says_so_in_one_line(tmp_path, part, value):
    """A meta.json whose parts are of another type (another kforge, a restored out/) made `doit info` a TypeError
    or AttributeError traceback while it named what changed in the key."""
    meta = {"key": "k" * 64, "source": {"digests": {"tk/scale.py": "a" * 64}},
            "constexprs": {"BLOCK": 64}, "toolchain_versions": {}, "env": {}}
    meta[part] = value if part != "source" else {"digests": value}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    target = SimpleNamespace(meta_path=str(tmp_path / "meta.json"), key="j" * 64, constexprs=(("BLOCK", 64),),
                             source_digests=(("tk/scale.py", "a" * 64),), toolchain_versions=(), env=())
    assert commands._key_change(target) in ("its meta.json is not of this kforge's shape",
                                            "its meta.json is unreadable")


def test_a_target_state_shows_names_from_out_with_control_characters_replaced(tmp_path):
    """A name in a restored meta.json (a source's, a constexpr's) reached the terminal with its escape sequences."""
    meta = {"key": "k" * 64, "source": {"digests": {"tk/\x1b[31mred.py": "a" * 64}}}
    artifact_dir = tmp_path / "out" / "sm_90a" / "scale" / "x"
    artifact_dir.mkdir(parents=True)
    (artifact_dir / "meta.json").write_text(json.dumps(meta))
    target = SimpleNamespace(meta_path=str(artifact_dir / "meta.json"), key="j" * 64, source_digests=(),
                             layout=SimpleNamespace(observed_inputs=tmp_path / "out" / ".kforge" / "inputs.json"))
    state = commands.target_state(target)
    assert "\x1b" not in state and "tk/\ufffd[31mred.py gone" in state, state


def test_doits_dumpdb_is_one_line_naming_kforges_state(tmp_path):
    """`doit dumpdb` opens doit's dbm files, and kforge's is SQLite: it was a dbm.error traceback (no project need
    be built: the command line is checked before anything is loaded)."""
    root = make_project(tmp_path / "p")
    proc = doit(root, "dumpdb", check=False)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("kforge: `doit dumpdb` reads doit's dbm files") and proc.stderr.count("\n") == 1


def test_a_pyproject_naming_a_command_where_kforge_has_none_is_one_line_with_the_fix(tmp_path):
    """A name or a module of kforge's that is not there (a typo, a module since moved) was doit's 'Plugin COMMAND'
    traceback at the command's first use."""
    root = make_project(tmp_path / "p")
    pyproject = root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("kforge.edge.commands:Forget", "kforge.edge.commands:Forgett")
                         .replace("kforge.edge.commands:Prune", "kforge.edge.prune:Prune"))
    for command, why in (["forget", "kforge.edge.commands has no Forgett"], ["prune", "no module kforge.edge.prune"]):
        proc = doit(root, command, check=False)
        assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
        assert why in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
        assert f'write `{command} = "kforge.edge.commands:{command.title()}"`' in proc.stderr


def test_info_of_a_broken_family_shows_its_spec_file_name_without_its_escape_sequence(tmp_path):
    """A checkout's spec file named with an escape sequence reached the terminal through `doit info`'s line."""
    root = make_project(tmp_path / "p", specs={"esc\x1b[31mred": '[kernel]\nname = "bad"\n'})
    out = doit(root, "info", "bad").stdout
    assert "\x1b" not in out and "specs/esc\\x1b[31mred.toml" in out, out   # written as Python writes it


def test_prune_names_a_folder_it_keeps_without_its_escape_sequence(tmp_path):
    """A folder at an artifact's place named with an escape sequence (a restored out/) reached the terminal through
    prune's line naming what it kept."""
    root = make_project(tmp_path / "p")
    (root / "out" / "sm_90a" / "scale" / "x\x1b]0;owned\x07").mkdir(parents=True)
    out = doit(root, "prune").stdout
    assert "kept 1 entry" in out and "\x1b" not in out and "\x07" not in out, out


def linked_out(tmp_path):
    """out/ whose gfx942/ is a link to a folder outside holding scale/c/error.txt as kforge writes it: (out, the
    artifact folder through the link, the error.txt outside)."""
    outside = tmp_path / "outside"
    (outside / "scale" / "c").mkdir(parents=True)
    (outside / "scale" / "c" / "error.txt").write_text(f"key: {'ab' * 32}\nscale:c@gfx942 failed\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "gfx942").symlink_to(outside, target_is_directory=True)
    return tmp_path / "out", tmp_path / "out" / "gfx942" / "scale" / "c", outside / "scale" / "c" / "error.txt"


def refused_line(out) -> str:
    return (f"kforge: refused: {out / 'gfx942'} (a symbolic link) leads outside out/ ({out.parent / 'outside'}/scale); "
            f"kforge writes and deletes nothing outside out/: remove the link and run again\n")


def test_clean_and_forget_through_a_link_out_of_out_refuse_in_one_line_and_prune_passes_it_by(tmp_path, monkeypatch):
    """commands.py 46-47, 219-220 (OutsideOut: an arch folder of out/ that is a link leading outside, holding what
    looks like kforge's): never run in the whole suite's coverage. The commands' own methods on
    stand-in tasks and doit state, no doit run and no build."""
    import io
    from kforge.base.layout import Layout
    from kforge.edge.backend import KforgeSqliteDB
    out, artifact_dir, planted = linked_out(tmp_path)
    target = SimpleNamespace(out_dir=str(artifact_dir), layout=Layout(tmp_path))
    task = SimpleNamespace(name="scale:c@gfx942", meta={"kforge_target": target}, clean_actions=[])
    clean = object.__new__(commands.Clean)
    clean.dep_manager, clean.outstream = SimpleNamespace(close=lambda: None), io.StringIO()
    clean.clean_tasks([task], dryrun=False, cleanforget=False)
    assert clean.outstream.getvalue() == "kforge: removed 0 artifacts from out/\n" + refused_line(out)
    forget = object.__new__(commands.Forget)
    forget.dep_manager = SimpleNamespace(backend=object.__new__(KforgeSqliteDB))
    forget.task_list, forget.outstream = [task], io.StringIO()
    monkeypatch.setattr(commands.DoitForget, "_execute", lambda self, *args: 0)   # doit's own part: its db
    assert forget._execute([], False, True) == 0
    assert forget.outstream.getvalue() == refused_line(out)
    prune = object.__new__(commands.Prune)
    prune.task_list, prune.outstream = [], io.StringIO()
    monkeypatch.chdir(tmp_path)
    assert prune._execute() == 0
    # prune never enters a linked arch folder (layout.artifact_dirs): its OutsideOut (264-265) needs a folder
    # swapped for a link between its listing and its removal
    assert prune.outstream.getvalue() == "kforge: nothing to prune: every artifact in out/ belongs to a target\n"
    assert planted.exists()


def test_forget_clean_and_prune_of_an_unwritable_artifact_folder_are_one_line_each_and_exit_1(tmp_path, monkeypatch):
    """An artifact folder nothing in which can be deleted (`chattr +i`, or a root-owned out/ that Docker left, for a
    non-root user) was a 20-line traceback ending in PermissionError, exit code 3, from all three commands: now one
    line naming the folder and the fix, the other target deleted, exit code 1. The commands' own methods on
    stand-in tasks; chattr monkeypatched (it needs root and a file system that has it)."""
    import io
    import shutil
    from kforge.base.layout import Layout
    from kforge.edge.backend import KforgeSqliteDB
    from kforge.store import artifact
    arch_dir = tmp_path / "out" / "sm_90a" / "scale"

    def built(config):
        folder = arch_dir / config
        folder.mkdir(parents=True)
        (folder / "meta.json").write_bytes(artifact.meta_bytes({"key": "K", "binary": "k.cubin", "sha256": "0"}))
        (folder / "k.cubin").write_bytes(b"\x7fELF")
        return folder

    def refuse(real):   # as `chattr +i out/sm_90a/scale/locked` refuses
        def call(path, *args, **kwargs):
            if arch_dir / "locked" in (Path(path), Path(path).parent):
                raise PermissionError(1, "Operation not permitted", str(path))
            return real(path, *args, **kwargs)
        return call
    monkeypatch.setattr(os, "unlink", refuse(os.unlink))
    monkeypatch.setattr(os, "rmdir", refuse(os.rmdir))
    real_access = os.access   # an immutable folder: the system says so when asked whether it can be written
    monkeypatch.setattr(os, "access", lambda path, mode, *args, **kwargs: Path(path) != arch_dir / "locked" and
                        real_access(path, mode, *args, **kwargs))

    def targets():
        shutil.rmtree(tmp_path / "out", ignore_errors=True)
        return [SimpleNamespace(name=f"scale:{c}@sm_90a", clean_actions=[], meta={"kforge_target": SimpleNamespace(
            out_dir=str(built(c)), layout=Layout(tmp_path))}) for c in ("locked", "free")]

    def kept_and_said(outstream, head=""):
        locked = arch_dir / "locked"
        assert outstream.getvalue() == (
            f"{head}kforge: cannot delete {locked}/k.cubin (Operation not permitted): make {locked} writable "
            f"(`chattr -i` it, or `chown` it to you: a root-owned out/ that Docker left, say) or delete it as its "
            f"owner, then run again\n")
        assert sorted(p.name for p in locked.iterdir()) == ["k.cubin", "meta.json"]   # nothing of it lost
        assert not (arch_dir / "free").exists()   # the other target's went

    tasks = targets()
    clean = object.__new__(commands.Clean)
    clean.dep_manager, clean.outstream = SimpleNamespace(close=lambda: None), io.StringIO()
    monkeypatch.setattr(commands.DoitClean, "_execute", lambda self, *args: self.clean_tasks(tasks, False, False))
    assert clean._execute(False, False, False, False) == 1
    kept_and_said(clean.outstream, "kforge: removed 1 artifact from out/\n")

    tasks = targets()
    forget = object.__new__(commands.Forget)
    forget.dep_manager = SimpleNamespace(backend=object.__new__(KforgeSqliteDB))
    forget.task_list, forget.outstream = tasks, io.StringIO()
    monkeypatch.setattr(commands.DoitForget, "_execute", lambda self, *args: None)   # doit's own part: its db
    assert forget._execute([], False, True) == 1
    kept_and_said(forget.outstream)

    built("free")   # both orphans: no target owns them
    monkeypatch.chdir(tmp_path)
    for head in ("kforge: pruned 1 artifact that belonged to no target\n", ""):   # not "nothing to prune" then
        prune = object.__new__(commands.Prune)
        prune.task_list, prune.outstream = [], io.StringIO()
        assert prune._execute() == 1
        kept_and_said(prune.outstream, head)


def test_doit_cache_with_a_bad_setting_is_one_line_and_exit_code_2(monkeypatch, capsys):
    """commands.py 304-306 (`doit cache` with local_cache_limit=abc): never run in the whole suite's coverage."""
    monkeypatch.setenv("KFORGE_LOCAL_CACHE_LIMIT", "abc")
    assert object.__new__(commands.Cache).execute({}, []) == 2
    err = capsys.readouterr().err
    assert err.startswith("kforge: KFORGE_LOCAL_CACHE_LIMIT in the environment: got 'abc'; expected a size in bytes")
    assert err.count("\n") == 1
