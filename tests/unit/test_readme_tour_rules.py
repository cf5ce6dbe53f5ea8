"""The README tour's reading rules (tests/readme_tour.py): what a block is, what ``...`` and "figures vary" allow,
and that a shown line the command did not print is caught."""

from __future__ import annotations

from readme_tour import mismatch, padded, parse

README = """intro
<!-- tour: not run: installs; tests/integration/test_wheel_install.py -->
```bash
pip install .
```
<!-- tour: figures vary -->
```console
$ scalpel profile -- a.py \\
    --epochs 2   # the script's own
step time: median 7.84 ms
...
next: scalpel doctor
$ scalpel memory evil.pickle   # exit 2
scalpel: error: no
$ scalpel serve b &
serving b
```
```python
print(1)
```
```
1
```
```toml
[defaults]
```
```diff
-a
+b
```
"""


def test_blocks_commands_exits_and_marks_are_read_as_written() -> None:
    install, console, snippet = parse(README)
    assert install.skip == "installs; tests/integration/test_wheel_install.py" and install.kind == "bash"
    assert console.vary and console.skip is None
    profile, memory, serve = console.commands
    assert profile.text == "scalpel profile -- a.py  --epochs 2   # the script's own" and profile.rc == 0
    assert profile.shown == ["step time: median 7.84 ms", "...", "next: scalpel doctor"]
    assert memory.rc == 2 and memory.shown == ["scalpel: error: no"]
    assert serve.background and serve.text == "scalpel serve b" and serve.shown == ["serving b"]
    assert snippet.kind == "python" and snippet.commands[0].shown == ["1"]  # toml and diff blocks are not run


def test_shown_lines_must_be_printed_in_order_and_whole() -> None:
    out = ["a", "b", "c", "d"]
    assert mismatch(["a", "b", "c", "d"], out, vary=False) is None
    assert mismatch(["a", "...", "d"], out, vary=False) is None
    assert mismatch(["...", "c", "..."], out, vary=False) is None
    assert mismatch(["a", "c", "d"], out, vary=False)  # a line left out without '...'
    assert mismatch(["a", "b"], out, vary=False)  # the output goes on
    assert mismatch(["...", "d", "c"], out, vary=False)  # out of order
    assert mismatch(["a", "...", "x"], out, vary=False)  # never printed
    assert mismatch(["...", "b...d"], ["a", "b and d"], vary=False) is None  # '...' inside a line: any text


def test_figures_compare_by_shape_only_where_the_readme_says_they_vary() -> None:
    shown = ["step time: median 7.84 ms, p90 8.47 ms", "│ data      │      0.37 │"]
    ran = ["step time: median 35.69 ms, p90 40.93 ms", "│ data │ 10.54 │"]
    assert mismatch(shown, ran, vary=True) is None
    assert mismatch(shown, ran, vary=False)
    assert mismatch(
        ["step time: median 7.84 ms"], ["step time: mean 7.84 ms"], vary=True
    )  # words still count
    stamp = ["record: scalpel-runs/20261201-131600-doctor-x/run.json"]
    assert mismatch(stamp, ["record: scalpel-runs/20261204-221556-doctor-x/run.json"], vary=False) is None


def test_padded_lines_are_found_but_a_diffs_empty_context_line_is_not() -> None:
    assert padded(["ok", "pad  ", " "]) == ["line 2 ends in spaces: 'pad  '"]
