"""A lab's directories are removed from several threads (teardown's longest step on a busy disk): the same result as
shutil.rmtree, and a symlink planted in the lab is removed, never followed."""

from __future__ import annotations

import os
from pathlib import Path

from pglab.targets.local.removal import remove_tree


def test_everything_under_the_lab_goes_and_nothing_a_symlink_points_to(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "dir" / "keep.txt").write_text("not the lab's")
    (outside / "file.txt").write_text("not the lab's either")
    lab = tmp_path / "lab"
    for i in range(30):
        d = lab / f"n{i % 3}" / "data" / "base" / str(i)
        d.mkdir(parents=True)
        for j in range(20):
            (d / str(j)).write_bytes(b"x" * j)
    (lab / "empty" / "deeper").mkdir(parents=True)
    (lab / "n0" / "to-dir").symlink_to(outside / "dir")
    (lab / "n0" / "to-file").symlink_to(outside / "file.txt")
    (lab / "n1" / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(lab / "n2" / "fifo")
    remove_tree(lab)
    assert not lab.exists() and not lab.is_symlink()
    assert (outside / "dir" / "keep.txt").read_text() == "not the lab's"
    assert (outside / "file.txt").read_text() == "not the lab's either"


def test_a_missing_path_or_a_symlink_given_as_the_lab_is_left_as_rmtree_leaves_it(tmp_path: Path) -> None:
    remove_tree(tmp_path / "absent")  # nothing to do, no error
    target = tmp_path / "real"
    target.mkdir()
    (target / "f").write_text("kept")
    link = tmp_path / "link"
    link.symlink_to(target)
    remove_tree(link)  # rmtree refuses a symlink (its error ignored): neither it nor what it names is emptied
    assert (target / "f").read_text() == "kept"
