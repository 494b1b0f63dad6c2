"""rules/store/inputs.py: the depfile check's index takes in what the compile servers hashed (learn), so the first
no-op after a build stats an input instead of hashing it again."""
import hashlib
import os

from kforge.base import stamps
from kforge.base.layout import Layout
from kforge.store import inputs


def project(tmp_path):
    root = tmp_path / "p"
    (root / "out" / ".kforge").mkdir(parents=True)
    (root / "big.bin").write_bytes(b"data")
    return Layout(root), root / "big.bin"


def test_the_index_takes_what_a_server_hashed_while_the_files_identity_is_the_one_hashed(tmp_path, monkeypatch):
    layout, big = project(tmp_path)
    digest = hashlib.sha256(b"data").hexdigest()
    inputs.learn(layout, {os.path.realpath(big): [stamps.identity(str(big)), digest]})
    hashed = []
    real_content = stamps.content
    monkeypatch.setattr(stamps, "content", lambda path: hashed.append(path) or real_content(path))
    index = inputs.InputIndex(layout.observed_inputs, root=str(layout.root))
    assert index.digest("big.bin") == digest and hashed == []   # stat'ed, not read
    index.save()
    assert list((layout.state / inputs.LEARNED).iterdir()) == []   # taken in: the servers' files go
    again = inputs.InputIndex(layout.observed_inputs, root=str(layout.root))
    assert again.digest("big.bin") == digest and hashed == []   # the saved index has it


def test_a_digest_learned_for_another_identity_is_not_taken(tmp_path, monkeypatch):
    layout, big = project(tmp_path)
    inputs.learn(layout, {os.path.realpath(big): [stamps.identity(str(big)), "0" * 64]})
    big.write_bytes(b"new data, after the server hashed it")   # another size, another identity
    index = inputs.InputIndex(layout.observed_inputs, root=str(layout.root))
    assert index.digest("big.bin") == hashlib.sha256(big.read_bytes()).hexdigest()


def test_a_servers_file_of_another_shape_is_dropped_with_one_warning(tmp_path, capsys):
    layout, big = project(tmp_path)
    (layout.state / inputs.LEARNED).mkdir()
    (layout.state / inputs.LEARNED / "1-00000000.json").write_text('{"x": [1, 2]}')
    inputs.InputIndex(layout.observed_inputs, root=str(layout.root))
    assert capsys.readouterr().err.count("\n") == 1 and not list((layout.state / inputs.LEARNED).iterdir())

