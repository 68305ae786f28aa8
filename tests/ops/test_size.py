"""Size as a stated goal (ops/size.py): no request-path class over its bound."""

from __future__ import annotations

from ops.size import ClassSize, class_sizes, over_the_goal, shipped_files


def _every_class() -> list[ClassSize]:
    return [size for path in shipped_files() for size in class_sizes(path)]


def test_no_request_path_class_is_over_its_bound() -> None:
    assert over_the_goal(_every_class()) == []


def test_a_big_class_is_refused_on_the_request_path_only() -> None:
    assert over_the_goal([ClassSize("protocol/new.py:Fits", 300, True)]) == []
    assert over_the_goal([ClassSize("protocol/new.py:Big", 301, True)]) != []
    assert over_the_goal([ClassSize("ops/spark/new.py:Big", 900, False)]) == []
