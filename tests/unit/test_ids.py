from hypothesis import given
from hypothesis import strategies as st

from pipeline.ids import stable_id


def test_same_parts_same_id_and_prefix_kept() -> None:
    assert stable_id("act", "node-1", 5) == stable_id("act", "node-1", 5)
    assert stable_id("act", "node-1", 5).startswith("act-")


@given(st.lists(st.text(max_size=8), min_size=2, max_size=4))
def test_joining_is_unambiguous(parts: list[str]) -> None:
    # ("ab", "c") and ("a", "bc") must not collide, nor must a list and its concatenation
    assert stable_id("x", *parts) != stable_id("x", "".join(parts))
    assert stable_id("x", *parts) != stable_id("x", *parts[1:], parts[0]) or len(set(parts)) == 1
