"""The README's Python examples run as written."""
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_the_two_commands_near_the_top():
    head = README.read_text()[:800]
    assert "make demo" in head and "make test" in head


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_block_runs(i, capsys):
    exec(compile(BLOCKS[i], f"README block {i}", "exec"), {"__name__": "__readme__"})
