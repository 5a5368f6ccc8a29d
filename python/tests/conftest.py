"""Fixtures the test modules share."""

import pytest

import veil


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    """A tiny random Llama decoder folder (ChatML template), the same one for every module."""
    d = tmp_path_factory.mktemp("tiny-decoder")
    veil.write_tiny_decoder(d, seed=5)
    return d
