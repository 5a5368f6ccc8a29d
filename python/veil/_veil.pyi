"""Type stubs of the extension module behind ``veil`` (see ``veil/__init__.py``)."""

import os
from types import TracebackType
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Type, Union

import numpy as np
import numpy.typing as npt

_Model = Union[str, "os.PathLike[str]"]
_Result = Tuple[int, npt.NDArray[np.float64]]
_Prompt = Union[str, Tuple[str, str]]

__version__: str

class VeilError(RuntimeError):
    """An error of Veil's that is not an invalid argument, a missing file, a timeout or a
    connection failure (a malformed message from the peer, a refused session, ...)."""

class Server:
    """Serves a model to private-inference clients from background threads, with the session
    limits of ``veil serve``; a decoder LLM ("smollm2-135m-instruct", a ``.gguf`` file, a
    Hugging Face decoder folder) is served for private generation. TLS 1.3 with the identity in ``state_dir`` unless
    ``insecure_plaintext``. A context manager: leaving the ``with`` block stops it."""

    def __init__(
        self,
        model: _Model = "default",
        listen: str = "127.0.0.1:0",
        *,
        state_dir: Optional[_Model] = None,
        insecure_plaintext: bool = False,
        max_sessions: Optional[int] = None,
        ntt_budget_mib: int = 0,
        private_tables: bool = False,
        truncation: Optional[str] = None,
    ) -> None:
        """``private_tables``: a decoder's token embedding and output table stay the server's
        too (a private lookup and an HE head each step; Llama family only); its clients pass
        ``private_tables=True``. ``truncation``: a decoder's truncations after products,
        ``"faithful"`` (the default: every step's logits the simulator's, bit for bit) or
        ``"one-bit-error"`` (each may land one unit low; about half the flights)."""
    @property
    def address(self) -> str:
        """"HOST:PORT" the server listens on."""
    @property
    def fingerprint(self) -> Optional[str]:
        """SHA-256 of the server's TLS certificate (hex); None over plain TCP."""
    @property
    def running(self) -> bool:
        """Whether it still accepts connections."""
    def stop(self) -> None:
        """Stops accepting and waits for open sessions (at most 60 s)."""
    def __enter__(self) -> "Server": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

class Client:
    """A private-inference session with a server. ``bundle``: a bundle folder from
    ``export_client``, a full model folder or "default". The server must have ``fingerprint``
    (hex); without it, the first connection to an address is trusted and recorded in
    ``known_servers``. A context manager: leaving the ``with`` block closes the session."""

    def __init__(
        self,
        bundle: _Model = "default",
        server: str = "127.0.0.1:7878",
        *,
        fingerprint: Optional[str] = None,
        known_servers: Optional[_Model] = None,
        identity: Optional[_Model] = None,
        insecure_plaintext: bool = False,
        pad_to: Optional[int] = None,
        truncate: bool = False,
        max_tokens: Optional[int] = None,
        timeout: float = 600.0,
        connect_timeout: float = 10.0,
        max_context: Optional[int] = None,
        private_tables: bool = False,
    ) -> None:
        """A decoder model as ``bundle`` makes a generation client (``generate``, ``chat``;
        ``max_context``: positions each generation's session reserves, default 512 or the
        model's context); each generation is then a session of its own. ``bundle`` may then be
        the decoder's client bundle (``export_client``), which holds no weight;
        ``private_tables=True`` for a server that keeps its tables private (the bundle needs
        none)."""
    def generate(
        self,
        prompt: str,
        *,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        fixed_length: bool = False,
        preprocess: bool = False,
        pad_to: Optional[int] = None,
    ) -> "TextStream":
        """A decoder's text after ``prompt``, generated privately, as an iterator of text
        pieces. The server learns the prompt's length and the number of steps
        (``fixed_length``: always ``max_new_tokens``; ``pad_to=N``: N instead of the prompt's
        length, the prompt padded with tokens no real position attends to, a longer prompt
        refused). ``preprocess``: each decode step runs
        as an offline phase (FC masks, attention triples, OT pool fill) and then its online part,
        after the previous piece was returned, so the online part moves fewer bytes; the two run
        back to back (a token takes as long as without) and the text is the same."""
    def chat(
        self,
        messages: Sequence[Dict[str, str]],
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        fixed_length: bool = False,
        preprocess: bool = False,
        pad_to: Optional[int] = None,
    ) -> str:
        """The assistant's answer to ``messages`` (``{"role", "content"}`` dicts) in the
        model's chat template, generated privately; options as ``generate``'s."""
    def classify(self, texts: Sequence[str]) -> List[_Result]:
        """(label, probabilities) of each text, classified privately. Every text is checked
        before the first is sent."""
    def classify_pairs(self, pairs: Sequence[Tuple[str, str]]) -> List[_Result]:
        """As ``classify``, on sentence pairs (first, second) for a pair model such as
        ``mrpc-minilm-l6``. A model whose config records what it was trained on
        (``veil.inputs``, as fine-tuning writes it) takes only that kind: ``classify`` on a
        pair model, or ``classify_pairs`` on a sentiment model, raises ValueError."""
    def classify_ids(self, ids: Sequence[Sequence[int]]) -> List[_Result]:
        """As ``classify``, on token-id sequences (special tokens included, token types 0:
        a pair model raises ValueError)."""
    def preprocess(self, prompts: Sequence[_Prompt]) -> List[Dict[str, Any]]:
        """Has the server preprocess the inferences of these prompts (texts, or ``(first,
        second)`` pairs for a pair model) now (the prompt-independent
        work); their later ``classify`` runs only the online phase. Returns each offline cost.
        Raises VeilError if the server refuses (its budget; the session goes on)."""
    @property
    def cost(self) -> Optional[Dict[str, Any]]:
        """The cost report of the last classified prompt (None before the first)."""
    @property
    def costs(self) -> List[Dict[str, Any]]:
        """The cost reports of every prompt of the last call."""
    @property
    def config(self) -> Dict[str, Any]:
        """The model's public configuration (config.json)."""
    def close(self) -> None:
        """Ends the session politely."""
    def __enter__(self) -> "Client": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

class TextStream(Iterator[str]):
    """The text of a private generation, piece by piece as its tokens are chosen."""

    def __iter__(self) -> "TextStream": ...
    def __next__(self) -> str: ...

def default_model() -> str:
    """Path of the built-in SST-2 model as a complete Hugging Face folder (fetched and
    assembled into the cache on first use)."""

def export_client(model: _Model, out_dir: _Model, *, private_tables: bool = False) -> None:
    """Writes the client bundle of ``model`` (config, tokenizer, public tables) to ``out_dir``.
    For a decoder, ``private_tables=True`` leaves its tables out (for a server that keeps
    them)."""

def export(model: _Model, out_dir: _Model) -> None:
    """Writes ``model`` as a complete Hugging Face folder to ``out_dir``."""

def simulate(model: _Model, prompts: Sequence[_Prompt]) -> List[_Result]:
    """(label, probabilities) of each prompt (a text, or a ``(first, second)`` pair for a pair
    model) from the fixed-point simulator on plaintext."""

def write_tiny_model(out_dir: _Model, *, labels: int = 2, seed: int = 0) -> None:
    """Writes a tiny random BERT classifier (vocabulary: good great bad awful the film) for tests."""

def write_tiny_decoder(out_dir: _Model, *, seed: int = 0, max_positions: int = 256) -> None:
    """Writes a tiny random Llama decoder folder (ChatML template) for tests of the decoder commands."""
