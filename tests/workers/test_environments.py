"""Reading a repository's tree for its environment, without Docker: the spec and key come from
the tree's regular files, on every Python the worker may run on."""

from __future__ import annotations

import io
import tarfile

import pytest

from workers import environments


def tar(files: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            archive.addfile(info)
    return buffer.getvalue()


TREE = {
    "requirements.txt": b"attrs==23.1\n",
    "app.py": b"",
    "tests/test_app.py": b"import pytest\n",
}


@pytest.mark.parametrize("with_data_filter", [True, False])
def test_the_spec_and_key_come_from_the_trees_files_with_or_without_tars_data_filter(
    monkeypatch: pytest.MonkeyPatch, with_data_filter: bool
) -> None:
    expected = environments._spec_and_key(tar(TREE), None, "base")
    if not with_data_filter:  # Debian bookworm's Python 3.11.2, in the service image
        monkeypatch.delattr(tarfile, "data_filter")

    spec, key = environments._spec_and_key(
        tar(TREE, links={"outside": "/etc/passwd"}), None, "base"
    )

    assert (spec, key) == expected
    assert spec.test == "python -m pytest"
    assert spec.inputs == ("requirements.txt",)


def test_a_tree_with_a_path_out_of_it_is_refused_without_the_data_filter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(tarfile, "data_filter")

    with pytest.raises(ValueError, match=r"'\.\./escape\.txt'"):
        environments._spec_and_key(tar({"../escape.txt": b"x"}), None, "base")
