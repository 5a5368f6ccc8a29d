"""The ``veil`` command for tests that compare the package with it: the binary ``cargo test
--workspace`` built (``target/debug/veil``), or ``$VEIL_BIN``; without it a test is skipped,
and fails under CI."""

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def veil_binary():
    path = pathlib.Path(os.environ.get("VEIL_BIN", ROOT / "target" / "debug" / "veil"))
    if not path.is_file():
        why = f"{path} is missing: run `cargo test --workspace` (or `cargo build -p veil-cli`) first"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return str(path)
