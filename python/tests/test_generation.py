"""Private generation from Python: a ``veil.Server`` serving a tiny random Llama decoder in
background threads (over TLS, its fingerprint pinned) and ``veil.Client.generate`` /
``Client.chat`` against it. The text equals the fixed-point simulator's (``veil generate
--simulate``, the oracle) whenever no step's top-two logits are within twice the default
1-bit-error mode's reach (checked first: the random model and the simulator are deterministic);
``fixed_length``, ``preprocess`` (each decode step preprocessed just before it) and ``pad_to`` change
nothing in the answer; misuse raises ``ValueError``.
The ``veil`` command is ``veil_cli.veil_binary()``'s."""

import json
import subprocess

import pytest

import veil
from veil_cli import veil_binary

# The most the default one-bit-error truncations move a logit on these models
# (crates/veil-private/tests/protocol/decoder_party.rs, ONE_BIT_ERROR_BOUND).
ONE_BIT_ERROR_BOUND = 0.02


@pytest.fixture(scope="module")
def client(decoder, tmp_path_factory):
    state = tmp_path_factory.mktemp("state")
    with veil.Server(decoder, listen="127.0.0.1:0", state_dir=state) as server:
        with veil.Client(decoder, server=server.address, fingerprint=server.fingerprint,
                         max_context=128) as c:
            yield c


def simulated(decoder, prompt, chat, n):
    args = [veil_binary(), "generate", "--model", str(decoder), "--simulate", "--json",
            "--max-new-tokens", str(n)]
    if chat:
        args.append("--chat")
    out = subprocess.run(args + [prompt], check=True, capture_output=True, text=True)
    report = json.loads(out.stdout)
    assert min(report["margins"]) > 2 * ONE_BIT_ERROR_BOUND, (
        f"a near-tie in the simulator's steps {report['margins']}: pick another prompt")
    return report["text"]


def test_generate_streams_the_simulators_text(decoder, client):
    want = simulated(decoder, "good film", chat=False, n=6)
    pieces = list(client.generate("good film", max_new_tokens=6))
    assert all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces) == want
    assert "".join(client.generate("good film", max_new_tokens=6, fixed_length=True)) == want
    assert "".join(client.generate("good film", max_new_tokens=6, preprocess=True)) == want
    # Padded to 40 positions (the server sees 40): the rotary tables' rounding at the shifted
    # positions moves a logit far less than the margins checked above.
    assert "".join(client.generate("good film", max_new_tokens=6, pad_to=40)) == want
    assert client.config["max_context"] == 128
    assert client.config["family"] == "llama"


def test_chat_answers_as_the_simulator(decoder, client):
    want = simulated(decoder, "good film", chat=True, n=5)
    got = client.chat([{"role": "user", "content": "good film"}], max_new_tokens=5)
    assert got == want
    got = client.chat([{"role": "user", "content": "good film"}], max_new_tokens=5, preprocess=True)
    assert got == want


def test_misuse_raises_value_error(decoder, client):
    with pytest.raises(ValueError, match="decoder"):
        client.classify(["good film"])
    with pytest.raises(ValueError, match="max_new_tokens"):
        client.generate("good film", max_new_tokens=0)
    with pytest.raises(ValueError, match="empty prompt"):
        client.generate("")
    with pytest.raises(ValueError, match="role"):
        client.chat([{"role": "user"}])
    with pytest.raises(ValueError, match="no messages"):
        client.chat([])
    # More tokens than the session's context, or a context longer than the model's, are
    # refused before anything is sent.
    with pytest.raises(ValueError, match="context of 128"):
        client.generate("good film", max_new_tokens=128)
    with pytest.raises(ValueError, match="more than"):
        client.generate("good film", pad_to=2)
    with pytest.raises(ValueError, match="max_context"):
        veil.Client(decoder, server="127.0.0.1:1", max_context=10**6)


def test_private_tables_from_a_bundle_without_weights(decoder, tmp_path):
    """A server that keeps its tables private, and a client that holds only the configuration
    and the tokenizer (``export_client(..., private_tables=True)``): the simulator's text."""
    bundle = tmp_path / "client"
    veil.export_client(decoder, bundle, private_tables=True)
    assert not (bundle / "model.safetensors").exists()
    assert not (bundle / "public.safetensors").exists()
    want = simulated(decoder, "good film", chat=True, n=4)
    with veil.Server(decoder, listen="127.0.0.1:0", insecure_plaintext=True,
                     private_tables=True) as server:
        with veil.Client(bundle, server=server.address, insecure_plaintext=True,
                         max_context=128, private_tables=True) as c:
            assert c.config["private_tables"]
            got = c.chat([{"role": "user", "content": "good film"}], max_new_tokens=4)
            assert got == want
        # The bundle has no tables to bring to an open-tables client.
        with pytest.raises(ValueError, match="private_tables|--private-tables"):
            veil.Client(bundle, server=server.address, insecure_plaintext=True)


def test_faithful_server_gives_the_simulators_text(decoder):
    """``truncation="faithful"``: the simulator's text (its logits, bit for bit); a bad mode
    is refused."""
    want = simulated(decoder, "good film", chat=False, n=4)
    with veil.Server(decoder, listen="127.0.0.1:0", insecure_plaintext=True,
                     truncation="faithful") as server:
        with veil.Client(decoder, server=server.address, insecure_plaintext=True,
                         max_context=64) as c:
            assert "".join(c.generate("good film", max_new_tokens=4)) == want
    with pytest.raises(ValueError, match="faithful"):
        veil.Server(decoder, listen="127.0.0.1:0", insecure_plaintext=True, truncation="exact")
