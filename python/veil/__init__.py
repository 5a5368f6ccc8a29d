"""Veil: private transformer inference from Python.

A client with a private prompt and a server with a private BERT-class model compute the model's
prediction together (BFV homomorphic encryption for the linear layers, OT-based secret sharing for
the rest): the server learns the prompt's length and nothing else, the client learns the output
and the model's public architecture.

    import veil
    with veil.Server(veil.default_model()) as server:
        with veil.Client(veil.default_model(), server=server.address,
                         fingerprint=server.fingerprint) as client:
            for label, probabilities in client.classify(["a gripping film", "a dull mess"]):
                print(label, probabilities)
            print(client.cost)

* ``Server(model, listen=...)`` serves a model from background threads (a context manager);
* ``Client(bundle, server=...)`` is one session: ``classify(texts)`` returns a list of
  ``(label, probabilities)`` with numpy arrays, ``cost`` the last prompt's cost report as a dict;
  with a decoder LLM (``Client("smollm2-135m-instruct", server=...)``, the server serving the
  same model), ``generate(prompt)`` streams a private generation's text and ``chat(messages)``
  returns the assistant's answer;
* ``export_client(model, out_dir)`` writes what a client needs (no server weight);
  ``export(model, out_dir)`` a complete Hugging Face folder;
* ``default_model()`` is the path of the built-in SST-2 model, assembled on first use;
* ``simulate(model, texts)`` runs the fixed-point simulator on plaintext (what a private
  classification reproduces); ``write_tiny_model(out_dir)`` writes a tiny random model for tests
  (``write_tiny_decoder(out_dir)`` a tiny random decoder).

A ``model`` is ``"default"``, a Hugging Face model folder, a shipped overlay folder or a model id
in the local Hugging Face cache (nothing is downloaded from a hub). Errors raise ``ValueError``
(invalid arguments), ``FileNotFoundError``, ``TimeoutError``, ``ConnectionError``, ``OSError`` or
``veil.VeilError``, with the messages of the ``veil`` command.
"""

from ._veil import (
    Client,
    Server,
    TextStream,
    VeilError,
    __version__,
    default_model,
    export,
    export_client,
    simulate,
    write_tiny_decoder,
    write_tiny_model,
)

__all__ = [
    "Client",
    "Server",
    "TextStream",
    "VeilError",
    "__version__",
    "default_model",
    "export",
    "export_client",
    "simulate",
    "write_tiny_decoder",
    "write_tiny_model",
]
