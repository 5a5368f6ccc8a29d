"""The Python package end to end on a tiny random model: a ``veil.Server`` in background threads,
``veil.Client`` sessions over TLS (pinned) and plain TCP, results equal to the fixed-point
simulator's, bundles, and the exceptions bad inputs raise."""

import json
import shutil

import numpy as np
import pytest

import veil

TEXTS = ["the film good", "awful film", "great great film the bad"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    veil.write_tiny_model(d, seed=3)
    return d


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    state = tmp_path_factory.mktemp("state")
    with veil.Server(tiny, listen="127.0.0.1:0", state_dir=state) as s:
        yield s


def test_private_classification_equals_the_simulator(tiny, server, tmp_path):
    expected = veil.simulate(tiny, TEXTS)
    bundle = tmp_path / "bundle"
    veil.export_client(tiny, bundle)
    assert (bundle / "public.safetensors").is_file()
    with veil.Client(bundle, server=server.address, fingerprint=server.fingerprint) as c:
        got = c.classify(TEXTS)
        assert len(got) == len(TEXTS)
        for (label, probs), (want_label, want_probs) in zip(got, expected):
            assert isinstance(probs, np.ndarray) and probs.dtype == np.float64
            assert label == want_label
            np.testing.assert_array_equal(probs, want_probs)
        cost = c.cost
        assert cost["bytes_client_to_server"] > 0 and cost["setup"]["rounds"] > 0
        assert "MatMul" in cost["per_op"]
        assert cost["offline"] is None
        assert len(c.costs) == len(TEXTS)
        assert c.config["veil"]["num_labels"] == 2
        # Preprocessed, the same results; the reports carry the offline phase.
        offline = c.preprocess(TEXTS[:2])
        assert len(offline) == 2 and offline[0]["bytes_client_to_server"] > 0
        again = c.classify(TEXTS[:2])
        for (label, probs), (want_label, want_probs) in zip(again, expected):
            assert label == want_label
            np.testing.assert_array_equal(probs, want_probs)
        assert all(r["offline"]["time_s"] > 0 for r in c.costs)
    assert server.running


def test_bad_inputs_raise_the_right_exception(tiny, server, tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        veil.Client(tmp_path / "nope", server=server.address, fingerprint=server.fingerprint)
    with pytest.raises(FileNotFoundError, match="Hugging Face cache"):
        veil.Server("no-org/no-such-model")
    with pytest.raises(ValueError, match="fingerprint|hex"):
        veil.Client(tiny, server=server.address, fingerprint="abc")
    with pytest.raises(ValueError, match="positive number of seconds"):
        veil.Client(tiny, server=server.address, timeout=0)
    wrong = "00" * 32
    with pytest.raises(veil.VeilError):
        veil.Client(tiny, server=server.address, fingerprint=wrong)
    with veil.Client(tiny, server=server.address, fingerprint=server.fingerprint) as c:
        with pytest.raises(ValueError, match="the prompt is empty"):
            c.classify(["   "])
        with pytest.raises(ValueError, match="more than the model's limit"):
            c.classify(["good " * 40])
        with pytest.raises(TypeError):
            c.classify("a string, not a list")
        # The session survives refused prompts.
        assert len(c.classify(["good film"])) == 1
    closed = veil.Client(tiny, server=server.address, fingerprint=server.fingerprint)
    closed.close()
    with pytest.raises(ValueError, match="closed"):
        closed.classify(["good"])


def test_plain_tcp_and_token_ids(tiny, tmp_path):
    with veil.Server(tiny, insecure_plaintext=True) as s:
        assert s.fingerprint is None
        with veil.Client(tiny, server=s.address, insecure_plaintext=True) as c:
            by_text = c.classify(["good film"])
            by_ids = c.classify_ids([[2, 5, 10, 3]])
            np.testing.assert_array_equal(by_text[0][1], by_ids[0][1])
            with pytest.raises(ValueError):
                c.classify_ids([[2, 500, 3]])
            # A pair is one prompt with segment ids 0 then 1, not the two texts run together.
            (pair,) = c.classify_pairs([("good film", "bad film")])
            (joined,) = c.classify(["good film bad film"])
            assert pair[1].shape == (2,) and abs(pair[1].sum() - 1) < 1e-9
            assert not np.array_equal(pair[1], joined[1])
            with pytest.raises(ValueError, match="both sentences"):
                c.classify_pairs([("good film", "")])
    assert not s.running


def test_a_model_trained_on_pairs_takes_only_pairs(tiny, server, tmp_path):
    paired = tmp_path / "paired"
    shutil.copytree(tiny, paired)
    config = json.loads((paired / "config.json").read_text())
    config["veil"]["inputs"] = "pairs"
    (paired / "config.json").write_text(json.dumps(config))
    pair = ("good film", "bad film")
    (want,) = veil.simulate(paired, [pair])
    with pytest.raises(ValueError, match="sentence pairs"):
        veil.simulate(paired, ["good film"])
    # A client whose files differ from what the server exports (here only the input mode) is
    # refused before anything is sent: the bundle digests differ.
    with pytest.raises(ValueError, match="is not the one the server exports"):
        with veil.Client(paired, server=server.address, fingerprint=server.fingerprint) as c:
            c.classify_pairs([pair])
    with veil.Server(
        paired, listen="127.0.0.1:0", state_dir=tmp_path / "state"
    ) as paired_server, veil.Client(
        paired, server=paired_server.address, fingerprint=paired_server.fingerprint
    ) as c:
        with pytest.raises(ValueError, match="sentence pairs"):
            c.classify(["good film"])
        with pytest.raises(ValueError, match="sentence pairs"):
            c.classify_ids([[2, 5, 3]])
        (offline,) = c.preprocess([pair])
        assert offline["bytes_client_to_server"] > 0
        ((label, probs),) = c.classify_pairs([pair])
        assert label == want[0]
        np.testing.assert_array_equal(probs, want[1])
        assert c.costs[0]["offline"] is not None
