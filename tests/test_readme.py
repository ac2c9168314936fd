"""Every example of the README's "Using the service" section, run as it is written against a live `python -m service`
on the real default model, so that the README cannot go stale.

The examples are read from README.md itself: editing a block there changes what this test runs. `console` blocks
are run command by command with bash (the port put in for 8080), in order, on one service; where the README shows
an output, the real one must have its shape: the same keys (more where the README writes `...`), the same list
lengths (longer where it writes `...`), the same strings (a prefix where a string ends in `...`), integers equal,
floats within 1e-3 (the same model computes them), and for header listings the same header names. `python` blocks
are run as they are, and a `# array of shape (a, b)` comment is checked against that line's value. The MTEB block
(`<!-- mteb-snippet -->`) is tests/test_mteb.py's.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from benchmarks.machine import stop
from tests.conftest import REPO, free_port, wait_ready

README = REPO / "README.md"
ELIDED = "\u2026"  # what a `...` outside a string in a shown output becomes: "and more here"
#: values that depend on what ran before on the same service (the index's global write sequence), not on the example
STATE_DEPENDENT = {"sequence"}


def section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block, the MTEB snippet left out."""
    blocks = []
    for m in re.finditer(r"(<!-- mteb-snippet -->\n)?```(\w+)\n(.*?)```", text, flags=re.S):
        if not m.group(1):
            blocks.append((m.group(2), m.group(3)))
    return blocks


@dataclass
class Example:
    command: str
    shown: str  # the output the README shows ("" for none)


def console_examples(block: str) -> list[Example]:
    """`$ command` (continued while its quotes are open) followed by the output lines up to a blank line."""
    examples: list[Example] = []
    lines = block.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            i += 1
            continue
        command = lines[i][2:]
        i += 1
        while True:
            try:
                shlex.split(command, comments=True)
                break
            except ValueError:  # an open quote: the command goes on
                command += "\n" + lines[i]
                i += 1
        shown = []
        while i < len(lines) and lines[i].strip() and not lines[i].startswith("$ "):
            shown.append(lines[i])
            i += 1
        examples.append(Example(command, "\n".join(shown)))
    return examples


def _mark_elisions(text: str) -> str:
    """JSON text with each `...` outside a string made a marker: an element in a list, a key in an object."""
    out, stack, in_string, i = [], [], False, 0
    while i < len(text):
        c = text[i]
        if in_string:
            out.append(c)
            if c == "\\":
                out.append(text[i + 1])
                i += 1
            elif c == '"':
                in_string = False
        elif text.startswith("...", i):
            out.append(f'"{ELIDED}"' if stack and stack[-1] == "[" else f'"{ELIDED}": null')
            i += 3
            continue
        else:
            out.append(c)
            if c == '"':
                in_string = True
            elif c in "[{":
                stack.append(c)
            elif c in "]}":
                stack.pop()
        i += 1
    return "".join(out)


def json_values(text: str) -> list:
    """Every JSON value in `text`, one after another (`{...}{...}` is two)."""
    decoder, values, i = json.JSONDecoder(), [], 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        value, i = decoder.raw_decode(text, i)
        values.append(value)
    return values


def assert_shape(shown, real, where: str = "$") -> None:
    if isinstance(shown, dict):
        assert isinstance(real, dict), f"{where}: {real!r} is not an object"
        keys = set(shown) - {ELIDED}
        if ELIDED in shown:
            assert keys <= set(real), f"{where}: the README shows keys {sorted(keys - set(real))} it does not have"
        else:
            assert keys == set(real), f"{where}: keys {sorted(real)}, the README shows {sorted(keys)}"
        for key in keys:
            if key in STATE_DEPENDENT:
                assert type(real[key]) is type(shown[key]), f"{where}.{key}"
            else:
                assert_shape(shown[key], real[key], f"{where}.{key}")
    elif isinstance(shown, list):
        assert isinstance(real, list), f"{where}: {real!r} is not a list"
        elided = bool(shown) and shown[-1] == ELIDED
        items = shown[:-1] if elided else shown
        if elided:
            assert len(real) >= len(items), f"{where}: {len(real)} items, the README shows more"
        else:
            assert len(real) == len(items), f"{where}: {len(real)} items, the README shows {len(items)}"
        for k, item in enumerate(items):
            assert_shape(item, real[k], f"{where}[{k}]")
    elif isinstance(shown, str):
        assert isinstance(real, str), f"{where}: {real!r} is not a string"
        if shown.endswith("..."):
            assert real.startswith(shown[:-3]), f"{where}: {real!r} does not start as the README's {shown!r}"
        else:
            assert real == shown, f"{where}: {real!r}, the README shows {shown!r}"
    elif isinstance(shown, bool) or shown is None:
        assert real is shown, f"{where}: {real!r}, the README shows {shown!r}"
    elif isinstance(shown, int):
        assert real == shown and not isinstance(real, bool), f"{where}: {real!r}, the README shows {shown!r}"
    else:
        assert isinstance(real, float) and abs(real - shown) <= 1e-3, f"{where}: {real!r}, the README shows {shown!r}"


def assert_output(example: Example, real: str) -> None:
    shown = example.shown.strip()
    if shown.startswith(("{", "[")):
        expected, got = json_values(_mark_elisions(shown)), json_values(real)
        assert len(got) == len(expected), f"{len(got)} answers, the README shows {len(expected)}: {real[:500]}"
        for e, g in zip(expected, got):
            assert_shape(e, g)
    else:  # a header listing
        names = re.findall(r"^([\w-]+):", shown, flags=re.M)
        assert names and names == re.findall(r"^([\w-]+):", real, flags=re.M), real


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """What `make serve` runs on a fresh clone: the default model exported by the Makefile's command, then
    `python -m service` on it with a fresh index: `.port`."""
    tmp = tmp_path_factory.mktemp("readme")
    export = tmp / "models" / "all-MiniLM-L6-v2"  # the Makefile's MODEL_DIR: its folder name is the model's name
    made = subprocess.run([sys.executable, "-m", "export", "--model", "default", "--out", str(export)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-3000:]
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEMBED_")}
    env.update(SEMBED_MODEL_DIR=str(export), SEMBED_PORT=str(port), SEMBED_HOST="127.0.0.1",
               SEMBED_API_WORKERS="1", SEMBED_DATA_DIR=str(tmp / "data"), SEMBED_DRAIN_DELAY_S="0",
               SEMBED_ACCESS_LOG="false")
    log = open(tmp / "service.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "service"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc, tmp / "service.log", timeout=120)
        proc.port = port
        yield proc
    finally:
        stop(proc)
        log.close()


BLOCKS = fenced_blocks(section("Using the service"))


def test_the_section_has_the_examples_this_test_runs():
    languages = [lang for lang, _ in BLOCKS]
    assert languages.count("console") >= 2 and languages.count("python") >= 1, languages
    commands = [e.command for lang, code in BLOCKS if lang == "console" for e in console_examples(code)]
    assert len(commands) >= 20 and all("localhost:8080" in c for c in commands)


def test_the_curl_examples_answer_what_the_readme_shows(service):
    ran, stale = 0, []
    for lang, code in BLOCKS:
        if lang != "console":
            continue
        for example in console_examples(code):
            command = example.command.replace("localhost:8080", f"127.0.0.1:{service.port}")
            result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
            try:
                assert result.returncode == 0, result.stderr
                if example.shown:
                    assert_output(example, result.stdout)
            except AssertionError as e:  # every stale example at once, not the first only
                stale.append(f"$ {example.command}\nanswered\n{result.stdout[:1500]}\nnot what the README shows: {e}")
            ran += 1
    assert not stale, "\n\n".join(stale)
    assert ran >= 20


def _shape_comments(code: str) -> dict[int, tuple[int, ...]]:
    return {n: tuple(int(x) for x in m.group(1).split(","))
            for n, line in enumerate(code.splitlines(), 1)
            if (m := re.search(r"# array of shape \(([\d, ]+)\)", line))}


def test_the_python_examples_run_against_the_service(service, monkeypatch):
    from huggingface_hub import constants

    # The suite runs with HF_HUB_OFFLINE=1 (no hub here); these clients talk only to the local service.
    monkeypatch.setattr(constants, "is_offline_mode", lambda: False)
    python = [code for lang, code in BLOCKS if lang == "python"]
    checked = 0
    for code in python:
        code = code.replace("localhost:8080", f"127.0.0.1:{service.port}")
        shapes = _shape_comments(code)
        namespace: dict = {"__name__": "readme"}
        for statement in ast.parse(code).body:
            compiled = ast.Module(body=[statement], type_ignores=[])
            if isinstance(statement, ast.Expr):
                value = eval(compile(ast.Expression(statement.value), str(README), "eval"), namespace)
                if statement.lineno in shapes:
                    assert np.shape(value) == shapes[statement.lineno], (ast.unparse(statement), np.shape(value))
                    checked += 1
            else:
                exec(compile(compiled, str(README), "exec"), namespace)
    assert checked >= 1
