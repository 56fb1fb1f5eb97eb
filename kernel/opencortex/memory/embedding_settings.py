"""`[memory]` settings: the stemmer of the full-text index, and the optional embedding
model recall fuses with its lexical ranking.

    [memory]
    stemmer = "porter"    # English stemming ("donated" finds "donate"); "none": words
                          # as written; or a Snowball language ("german", "russian",
                          # "english", ...: needs PyStemmer, see `stems`)

Nothing here is required.  Without `[memory.embeddings] model`, recall is
lexical only (per-owner FTS5) and no embedding package is imported::

    [memory.embeddings]
    model = "sentence-transformers:/home/me/models/all-MiniLM-L6-v2"  # a local directory
    # model = "python:mypackage.embed:embed"    # f(list[str]) -> list[list[float]]
    weight = 1.0          # the dense ranking's weight in reciprocal rank fusion
    k = 60                # RRF constant: 1 / (k + rank)
    max_candidates = 50   # dense candidates fused with the lexical ones
    min_similarity = 0.25 # cosine below which a message is not a dense candidate
    batch = 256           # messages embedded per recall (the rest on later recalls)
    max_vectors = 200000  # vectors searched per recall (the newest kept beyond)
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from opencortex.memory.stems import PREFIX, snowball_languages

PROVIDERS = ("sentence-transformers", "python")
_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


def check_model_spec(value: str) -> str:
    """VALUE if it names a usable provider ("sentence-transformers:/abs/dir" or
    "python:package.module:function"); ValueError saying the accepted forms."""
    provider, _, target = value.partition(":")
    if provider == "sentence-transformers":
        path = Path(target).expanduser()
        if not target or not path.is_absolute():
            raise ValueError(f"embedding model {value!r}: give the absolute path of a local "
                             "model directory, e.g. 'sentence-transformers:/home/me/models/"
                             "all-MiniLM-L6-v2' (nothing is downloaded)")
        return f"sentence-transformers:{path}"
    if provider == "python":
        if not _IMPORT_PATH.fullmatch(target):
            raise ValueError(f"embedding model {value!r}: give 'python:package.module:function' "
                             "naming a function f(list[str]) -> list[list[float]]")
        return value
    raise ValueError(f"embedding model {value!r}: use 'sentence-transformers:/path/to/model' "
                     "or 'python:package.module:function'")


class EmbeddingSettings(BaseModel):
    """`[memory.embeddings]`: the local model and how its ranking is fused with the lexical one."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None                          # None: recall is lexical only
    weight: float = Field(1.0, gt=0, le=100)          # dense list weight (lexical: 1)
    k: int = Field(60, ge=1, le=10_000)               # RRF: 1 / (k + rank)
    max_candidates: int = Field(50, ge=1, le=1000)    # dense hits taken into fusion
    min_similarity: float = Field(0.25, ge=-1, le=1)  # cosine a dense hit needs (model-dependent)
    batch: int = Field(256, ge=1, le=100_000)         # messages embedded per recall
    max_vectors: int = Field(200_000, ge=1)           # vectors searched per recall
    max_chars: int = Field(2000, ge=16, le=100_000)   # characters of a message embedded

    @field_validator("model")
    @classmethod
    def _known_provider(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        return check_model_spec(value.strip())


class MemorySettings(BaseModel):
    """`[memory]`: how remembered messages are searched."""

    model_config = ConfigDict(extra="forbid")

    embeddings: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    write_process: bool = False    # serve: files written by a child process (`write_process`)
    stemmer: str = "porter"        # the index's; another one rebuilds it

    @field_validator("stemmer")
    @classmethod
    def _known_stemmer(cls, value: str) -> str:
        value = value.strip().lower()
        if value in ("porter", "none"):
            return value
        try:
            languages = snowball_languages()
        except ImportError as error:               # says how to install PyStemmer
            raise ValueError(f"stemmer {value!r}: {error}") from None
        if value not in languages:
            raise ValueError(f"unknown stemmer {value!r}: use 'porter', 'none' or a Snowball "
                             f"language: {', '.join(languages)}")
        return value

    @property
    def tokenizer(self) -> str:
        """The index's tokenizer name for `stemmer` (see `memory.partitions`)."""
        return {"porter": "porter", "none": "unicode61"}.get(self.stemmer,
                                                             PREFIX + self.stemmer)
