"""Dense recall: the owner's messages ranked by a local embedding model, never required.

Only made when `[memory.embeddings] model` is set (`DenseRecall.from_settings`
returns None otherwise: nothing is imported, no file is created).  On each
recall it (1) embeds the question, (2) embeds up to `batch` of the scope's
messages that have no vector yet (newest first; the rest on later recalls),
and (3) returns the `max_candidates` nearest messages of the scope only whose
cosine reaches `min_similarity` (without it, every question would recall
something), each text once, as `SearchHit`s scored by cosine, for
`recall.Recall` to fuse with its lexical ranking (see `fusion`).

It never fails a turn: when the model cannot be loaded, dense recall is off
until the kernel restarts; when one call fails (an exception, vectors of the
wrong shape), that recall is lexical.  Either way one warning says why
(names and error types only, never message text); `opencortex doctor` loads
the model and shows the whole error.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Sequence

from opencortex.events import Thread
from opencortex.memory import Archive, SearchHit
from opencortex.memory.embedders import Embedder, EmbedderError
from opencortex.memory.embedding_settings import EmbeddingSettings
from opencortex.memory.rows import text_key
from opencortex.memory.vectors import VectorStore, VectorStoreError

log = logging.getLogger(__name__)

DISTINCT_READS = 4     # nearest vectors read per candidate kept (repeated texts are passed)


class DenseRecall:
    """The dense ranking of one archive's messages by the configured local model."""

    def __init__(self, archive: Archive, settings: EmbeddingSettings):
        """SETTINGS.model must be set; the model loads on the first `rank`."""
        if settings.model is None:
            raise ValueError("dense recall needs [memory.embeddings] model")
        self.settings = settings
        self.model = settings.model
        self.embedder = Embedder(settings.model)
        self.store = VectorStore(archive, settings.model, max_vectors=settings.max_vectors)
        self.off: str | None = None        # why dense recall is off until restart
        self._warned = False
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, archive: Archive, settings: EmbeddingSettings) -> DenseRecall | None:
        """Dense recall as SETTINGS configure it, or None when no model is configured."""
        return None if settings.model is None else cls(archive, settings)

    def rank(self, scope: Sequence[Thread], query: str, *, exclude_ids: Collection[str] = (),
             window: tuple[float, float] | None = None) -> list[SearchHit] | None:
        """The scope's messages nearest QUERY (best first; with WINDOW, those said within
        it first), or None when dense recall is unavailable (recall is then lexical)."""
        if self.off is not None or not query.strip():
            return None
        with self._lock:
            try:
                self.embedder.load()
            except EmbedderError as error:
                self.off = str(error)
                log.warning("dense recall is off until restart: %s", error)
                return None
            try:
                return self._rank(scope, query, exclude_ids, window)
            except Exception as error:          # never fail a turn: lexical this time
                self._failed(error)
                return None

    def _rank(self, scope: Sequence[Thread], query: str, exclude_ids: Collection[str],
              window: tuple[float, float] | None) -> list[SearchHit]:
        """The `max_candidates` nearest, each text once: small talk repeated word for
        word would otherwise fill the candidates (DISTINCT_READS times as many are read)."""
        [wanted] = self.embedder.embed([query[:self.settings.max_chars]])
        self.fill(scope)
        limit = self.settings.max_candidates
        nearest = self.store.search(scope, wanted, limit * DISTINCT_READS,
                                    exclude_ids=exclude_ids, window=window)
        nearest = [(id_, score) for id_, score in nearest
                   if score >= self.settings.min_similarity]
        records = self.store.records([id_ for id_, _ in nearest])
        hits: list[SearchHit] = []
        texts: set[str] = set()
        for id_, score in nearest:
            record = records.get(id_)
            text = None if record is None else text_key(record.text)
            if text is None or text in texts:
                continue
            texts.add(text)
            hits.append(SearchHit(**record.model_dump(), score=score, snippet=""))
            if len(hits) == limit:
                break
        return hits

    def fill(self, scope: Sequence[Thread]) -> int:
        """Embed up to `batch` messages of SCOPE that have no vector yet; how many were."""
        pending = self.store.pending(scope, self.settings.batch)
        texts = [text[:self.settings.max_chars] for _, _, text, _ in pending.rows]
        self.store.commit(pending, self.embedder.embed(texts))
        if texts:
            log.debug("dense recall: %d message(s) embedded", len(texts))
        return len(texts)

    def _failed(self, error: Exception) -> None:
        """Say once why a recall was lexical (later failures: at debug level)."""
        known = isinstance(error, (EmbedderError, VectorStoreError))
        reason = str(error) if known else f"{type(error).__name__} (run `opencortex doctor`)"
        if not self._warned:
            self._warned = True
            log.warning("dense recall failed, this recall is lexical: %s", reason)
        else:
            log.debug("dense recall failed again: %s", reason)

    def describe(self) -> str:
        """What /recall and doctor say about the ranking."""
        if self.off is not None:
            return f"lexical (dense model {self.model} is off: {self.off})"
        return (f"lexical + dense ({self.model}), fused by RRF (k={self.settings.k}, "
                f"dense weight {self.settings.weight:g})")

    def close(self) -> None:
        """Close the vectors file."""
        self.store.close()
