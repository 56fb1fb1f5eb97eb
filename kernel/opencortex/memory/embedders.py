"""Local embedding models, loaded lazily by name; nothing is downloaded.

A model is named as `[memory.embeddings] model` says (see `embedding_settings`):

- ``sentence-transformers:/abs/dir``: `SentenceTransformer(dir).encode(texts,
  normalize_embeddings=True)`; the package is imported on first use only, and the
  directory must hold the model (no hub name, no download);
- ``python:package.module:function``: any local callable ``f(list[str]) ->
  list[list[float]]`` (how a person plugs in another local model, and how the
  tests plug in a small deterministic one).

`Embedder.embed` checks what comes back (one vector per text, one dimension,
finite numbers) and returns unit-length float32 arrays, so a cosine is a dot
product.  Every failure is an `EmbedderError` whose message names the model and
never quotes the texts.
"""

from __future__ import annotations

import importlib
import logging
import math
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAX_DIMENSIONS = 8192      # a longer vector is refused (not an embedding model's output)


class EmbedderError(RuntimeError):
    """The embedding model could not be loaded or gave something unusable."""


class Embedder:
    """The model named SPEC, loaded on first `load` or `embed`."""

    def __init__(self, spec: str):
        """SPEC: "sentence-transformers:/abs/dir" or "python:package.module:function"."""
        self.spec = spec
        self._function: Callable[[list[str]], Any] | None = None
        self.dimensions: int | None = None

    def load(self) -> None:
        """Import and load the model now (EmbedderError saying why it cannot be)."""
        if self._function is None:
            provider, _, target = self.spec.partition(":")
            loaders = {"python": _python_function, "sentence-transformers": _sentence_transformer}
            if provider not in loaders:
                raise EmbedderError(f"embedding model {self.spec!r}: unknown provider")
            self._function = loaders[provider](target)
            log.info("embedding model %s loaded", self.spec)

    def embed(self, texts: Sequence[str]) -> list[array]:
        """One unit-length float32 vector per text (a zero vector stays zero)."""
        texts = list(texts)
        if not texts:
            return []
        self.load()
        try:
            output = self._function(texts)
        except Exception as error:        # a provider's own failure: its type, not its text
            raise EmbedderError(f"embedding model {self.spec!r} failed on {len(texts)} "
                                f"text(s): {type(error).__name__}") from error
        vectors = _checked(output, len(texts), self.spec)
        if self.dimensions is None:
            self.dimensions = len(vectors[0])
        elif len(vectors[0]) != self.dimensions:
            raise EmbedderError(f"embedding model {self.spec!r} changed its dimensions "
                                f"from {self.dimensions} to {len(vectors[0])}")
        return vectors


def _python_function(target: str) -> Callable[[list[str]], Any]:
    """The function at "package.module:function"."""
    module_name, _, name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise EmbedderError(f"embedding model 'python:{target}': cannot import {module_name} "
                            f"({type(error).__name__}: {error})") from error
    function = getattr(module, name, None)
    if not callable(function):
        raise EmbedderError(f"embedding model 'python:{target}': {module_name} has no "
                            f"function {name}")
    return function


def _sentence_transformer(target: str) -> Callable[[list[str]], Any]:
    """`encode` of the sentence-transformers model in the local directory TARGET."""
    path = Path(target)
    if not path.is_dir():
        raise EmbedderError(f"embedding model 'sentence-transformers:{target}': no such "
                            "directory (give a local model directory; nothing is downloaded)")
    try:
        from sentence_transformers import SentenceTransformer  # optional, heavy: lazily
    except ImportError as error:
        raise EmbedderError("embedding model 'sentence-transformers:...' needs the "
                            "sentence-transformers package: pip install "
                            "sentence-transformers") from error
    try:
        model = SentenceTransformer(str(path))
    except Exception as error:
        raise EmbedderError(f"embedding model 'sentence-transformers:{target}' could not "
                            f"be loaded ({type(error).__name__}: {error})") from error
    return lambda texts: model.encode(texts, normalize_embeddings=True)


def _checked(output: Any, count: int, spec: str) -> list[array]:
    """OUTPUT as COUNT unit-length float32 arrays of one dimension (EmbedderError if not)."""
    rows = output.tolist() if hasattr(output, "tolist") else output
    if not isinstance(rows, (list, tuple)) or len(rows) != count:
        got = len(rows) if isinstance(rows, (list, tuple)) else type(rows).__name__
        raise EmbedderError(f"embedding model {spec!r} returned {got} vector(s) for "
                            f"{count} text(s)")
    vectors, size = [], None
    for row in rows:
        try:
            values = [float(x) for x in row]
        except (TypeError, ValueError):
            raise EmbedderError(f"embedding model {spec!r} returned something other than "
                                "lists of numbers") from None
        size = size or len(values)
        if not 0 < len(values) <= MAX_DIMENSIONS or len(values) != size:
            raise EmbedderError(f"embedding model {spec!r} returned vectors of "
                                f"{len(values)} and {size} dimensions (1 to {MAX_DIMENSIONS}, "
                                "all the same)")
        if not all(math.isfinite(x) for x in values):
            raise EmbedderError(f"embedding model {spec!r} returned a value that is not a "
                                "finite number")
        vectors.append(unit(values))
    return vectors


def unit(values: Sequence[float]) -> array:
    """VALUES scaled to length 1, as float32 (a zero vector stays zero)."""
    length = math.sqrt(math.fsum(x * x for x in values))
    return array("f", values if length == 0 else (x / length for x in values))
