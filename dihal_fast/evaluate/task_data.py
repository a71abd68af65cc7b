"""Builders of the offline downstream tasks shipped in ``dihal_fast/assets/tasks`` (no network, seeded).

Two tasks from held-out text: by default the validation splits of TinyStories and Tiny Shakespeare in the
shared data (:data:`DEFAULT_SOURCES`), which neither the shipped backbone (trained on their ``.train``
splits) nor a hybrid trained by ``dihal replace`` on the default corpus (Gutenberg and State of the Union
validation text) has seen. Each task takes ``n_per_source`` examples from every source:

* ``dihal_lambada_local`` -- LAMBADA-style last-word prediction. A passage ends with the last word of a
  sentence; the model reads the passage before that word and must continue with it. As in LAMBADA's
  construction the word is made guessable from the passage, here automatically: it is a content word (not
  a function word) that already occurs earlier in the passage. Scored by lm-eval's ``loglikelihood``:
  ``acc`` = the greedy continuation is exactly the word's tokens, ``perplexity`` = exp(-mean log-lik).
* ``dihal_cloze_local`` -- next-sentence cloze. After a passage ending at a sentence boundary, pick the
  true next sentence among it and ``n_choices - 1`` distractor sentences of similar length drawn from
  other paragraphs of the same text. Scored by the log-likelihood of each choice: ``acc``, ``acc_norm``
  (per byte) and ``acc_mutual_info`` (log p(choice | passage) - log p(choice), which removes the choices'
  prior: on the shipped backbone plain ``acc`` is near chance on the TinyStories half because generic
  distractor sentences are a priori likelier than the story's true, more specific sentence).

``python -m dihal_fast.evaluate.task_data --source A.txt B.txt --out DIR`` rebuilds the files; with the
default settings and the sources of :data:`DEFAULT_SOURCES` (name -> sha256) it reproduces the shipped
ones byte for byte (``tests/test_downstream.py`` checks this where the shared data are present).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import random
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from dihal_fast.errors import DihalValueError

DEFAULT_SOURCES = {  # file name in the shared data's text/ -> sha256
    "tinystories.valid.txt": "4195e5cef1da56b098d81d025efe2eaffd0ce6ca80bed7b76b10f27663bec936",
    "tinyshakespeare.valid.txt": "c54f3753a4e6e3c3d1759212815a7caf826e68a33021b25312984400bed40a1f",
}
TASK_NAMES = ("dihal_lambada_local", "dihal_cloze_local")

# Words too predictable from syntax alone to test the use of the passage (as LAMBADA's filtering intends).
FUNCTION_WORDS = frozenset(
    """
a about after again all also am an and any are as at be been before being both but by can could did do
does doing down during each few for from further had has have having he her here hers herself him himself
his how i if in into is it its itself just me more most my myself no nor not now of off on once only or
other our ours out over own same she should so some such than that the their theirs them then there these
they this those through to too under until up very was we were what when where which while who whom why
will with would you your yours yourself day time one two said says say go went get got much many
""".split()
)  # noqa: SIM905 (the word list reads better as text)

_SENTENCE_END = re.compile(r"""[.!?]+["')\]]*(?=\s|$)""")
_LAST_WORD = re.compile(r"(?<= )([A-Za-z]+)$")
_WORD = re.compile(r"[A-Za-z]+")


@dataclass(frozen=True)
class TaskDataConfig:
    """How the examples are chosen (saved in the manifest beside the files)."""

    n_per_source: int = 150
    seed: int = 0
    min_context_words: int = 30
    max_context_words: int = 150
    n_choices: int = 4
    min_sentence_words: int = 4
    max_sentence_words: int = 30
    length_tolerance: float = 0.5  # distractor word count within (1 +- tolerance) x the true sentence's

    def __post_init__(self) -> None:
        if self.n_per_source < 1 or self.n_choices < 2 or self.min_context_words < 1:
            raise DihalValueError(f"need n_per_source >= 1, n_choices >= 2, min_context_words >= 1; got {self}")
        if self.max_context_words < self.min_context_words or self.max_sentence_words < self.min_sentence_words:
            raise DihalValueError(f"a maximum is below its minimum in {self}")


@dataclass(frozen=True)
class Sentence:
    """A sentence of one paragraph: character span ``[start, end)`` in the whole text, its paragraph index."""

    start: int
    end: int
    paragraph: int


def paragraphs(text: str) -> list[tuple[int, int]]:
    """Character spans of the paragraphs (blocks separated by blank lines), trailing whitespace excluded."""
    spans = []
    for match in re.finditer(r"\S(?:.*?\S)?(?=\s*\n\s*\n|\s*$)", text, flags=re.DOTALL):
        spans.append((match.start(), match.end()))
    return spans


def sentences(text: str, spans: Sequence[tuple[int, int]]) -> list[Sentence]:
    """Every sentence of every paragraph (ends at ``.``/``!``/``?`` plus closing quotes, or the paragraph end)."""
    out = []
    for index, (p_start, p_end) in enumerate(spans):
        start = p_start
        for match in _SENTENCE_END.finditer(text, p_start, p_end):
            out.append(Sentence(start, match.end(), index))
            start = match.end()
            while start < p_end and text[start].isspace():
                start += 1
        if start < p_end:
            out.append(Sentence(start, p_end, index))
    return out


def _words(text: str) -> int:
    return len(text.split())


def _context_start(
    text: str, spans: Sequence[tuple[int, int]], paragraph: int, end: int, settings: TaskDataConfig
) -> tuple[int, int] | None:
    """The passage before ``end``: its first paragraph and start, taking as many whole preceding paragraphs
    (plus the current one up to ``end``) as keep at most ``max_context_words`` words; None when that passage
    has fewer than ``min_context_words`` words (or the current paragraph alone has too many)."""
    if _words(text[spans[paragraph][0] : end]) > settings.max_context_words:
        return None
    first = paragraph
    while first > 0 and _words(text[spans[first - 1][0] : end]) <= settings.max_context_words:
        first -= 1
    start = spans[first][0]
    return (first, start) if _words(text[start:end]) >= settings.min_context_words else None


def lambada_examples(text: str, settings: TaskDataConfig, seed: int) -> list[dict]:
    """LAMBADA-style examples ``{"context", "target", "offset"}``: at most one per paragraph, sampled with the seed.

    ``target`` carries its leading space (``" word"``); ``context`` ends right before it; ``offset`` is the
    character position of the target word in the source text.
    """
    spans = paragraphs(text)
    by_paragraph: dict[int, list[dict]] = {}
    for sentence in sentences(text, spans):
        body = text[sentence.start : sentence.end]
        stripped = _SENTENCE_END.sub("", body)
        match = _LAST_WORD.search(stripped)
        if match is None or _SENTENCE_END.search(body) is None:
            continue
        word = match.group(1)
        word_start = sentence.start + match.start(1)
        passage = _context_start(text, spans, sentence.paragraph, word_start - 1, settings)
        if passage is None or word.lower() in FUNCTION_WORDS or len(word) < 3:
            continue
        context = text[passage[1] : word_start - 1]
        if word.lower() not in {w.lower() for w in _WORD.findall(context)}:
            continue
        by_paragraph.setdefault(sentence.paragraph, []).append(
            {"context": context, "target": " " + word, "offset": word_start}
        )
    rng = random.Random(seed)
    one_each = [rng.choice(found) for _, found in sorted(by_paragraph.items())]
    return _sample(one_each, settings.n_per_source, rng, "LAMBADA-style")


def cloze_examples(text: str, settings: TaskDataConfig, seed: int) -> list[dict]:
    """Next-sentence cloze examples ``{"context", "choices", "label", "offset"}``, at most one per paragraph.

    Every choice is a sentence that follows another one in its paragraph after a single space (so no choice
    opens a paragraph or a speech, and none starts with a speaker's name); the true one follows the context,
    distractors come from paragraphs outside the passage and its neighbours, with a word count within
    ``length_tolerance`` of the true one, and differ from it and from every choice already taken.
    """
    spans = paragraphs(text)
    all_sentences = sentences(text, spans)
    follows = {
        sentence: previous
        for previous, sentence in itertools.pairwise(all_sentences)
        if sentence.paragraph == previous.paragraph
        and text[previous.end : sentence.start] == " "
        and settings.min_sentence_words <= _words(text[sentence.start : sentence.end]) <= settings.max_sentence_words
    }
    pool = list(follows)
    rng = random.Random(seed)
    by_paragraph: dict[int, list[tuple[tuple[int, int], Sentence]]] = {}
    for sentence, previous in follows.items():
        passage = _context_start(text, spans, sentence.paragraph, previous.end, settings)
        if passage is not None:
            by_paragraph.setdefault(sentence.paragraph, []).append((passage, sentence))
    candidates = [rng.choice(found) for _, found in sorted(by_paragraph.items())]
    examples = []
    for (first_paragraph, start), sentence in candidates:
        true = text[sentence.start : sentence.end]
        n_true = _words(true)
        near = range(first_paragraph - 1, sentence.paragraph + 2)
        options = [
            s
            for s in pool
            if s.paragraph not in near
            and abs(_words(text[s.start : s.end]) - n_true) <= settings.length_tolerance * n_true
        ]
        rng.shuffle(options)
        choices = [true]
        for option in options:
            candidate = text[option.start : option.end]
            if candidate.lower() not in {c.lower() for c in choices}:
                choices.append(candidate)
            if len(choices) == settings.n_choices:
                break
        if len(choices) < settings.n_choices:
            continue
        order = list(range(settings.n_choices))
        rng.shuffle(order)
        examples.append(
            {
                "context": text[start : sentence.start - 1],
                "choices": [choices[i] for i in order],
                "label": order.index(0),
                "offset": sentence.start,
            }
        )
    return _sample(examples, settings.n_per_source, rng, "cloze")


def _sample(examples: list[dict], n: int, rng: random.Random, what: str) -> list[dict]:
    """``n`` of ``examples`` drawn with ``rng``, in source order; an error when fewer exist."""
    if len(examples) < n:
        raise DihalValueError(
            f"the source text gives only {len(examples)} {what} examples, {n} were asked for; "
            "pass a longer text or a smaller --n-per-source"
        )
    return sorted(rng.sample(examples, n), key=lambda example: example["offset"])


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _jsonl(rows: Sequence[dict]) -> bytes:
    return "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows).encode()


def build_tasks(
    sources: Sequence[str | Path], out_dir: str | Path, settings: TaskDataConfig = TaskDataConfig()
) -> dict:
    """Write ``<task>.jsonl`` for each of :data:`TASK_NAMES` and ``manifest.json`` into ``out_dir``.

    Every row carries its ``source`` (file name) and ``offset`` (character position in that file). Source
    ``i`` is sampled with seed ``settings.seed + i``. The manifest names each source with its byte count and
    sha256, the settings, and each written file's sha256 and number of examples. Returns the manifest.
    """
    from dihal_fast.common import atomic_write_bytes, atomic_write_json

    paths = [Path(source) for source in sources]
    if not paths:
        raise DihalValueError("build_tasks needs at least one source text")
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(
                f"task source text {path} does not exist (the shipped tasks come from the shared "
                f"data's text/{{{','.join(DEFAULT_SOURCES)}}})"
            )
    texts = [path.read_bytes().decode("utf-8") for path in paths]
    manifest: dict = {
        "sources": [{"name": path.name, "bytes": path.stat().st_size, "sha256": sha256_file(path)} for path in paths],
        "settings": asdict(settings),
        "files": {},
    }
    for name, build in zip(TASK_NAMES, (lambada_examples, cloze_examples)):
        rows = [
            {**row, "source": path.name}
            for index, (path, text) in enumerate(zip(paths, texts))
            for row in build(text, settings, settings.seed + index)
        ]
        data = _jsonl(rows)
        path = atomic_write_bytes(Path(out_dir) / f"{name}.jsonl", data)
        manifest["files"][path.name] = {"sha256": hashlib.sha256(data).hexdigest(), "examples": len(rows)}
    atomic_write_json(Path(out_dir) / "manifest.json", manifest)
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dihal_fast.evaluate.task_data", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--source",
        nargs="+",
        required=True,
        help=f"held-out text files (the shipped tasks: the shared data's text/{' and text/'.join(DEFAULT_SOURCES)})",
    )
    parser.add_argument("--out", required=True, help="directory for the .jsonl files and manifest.json")
    parser.add_argument("--n-per-source", type=int, default=TaskDataConfig.n_per_source)
    parser.add_argument("--seed", type=int, default=TaskDataConfig.seed)
    args = parser.parse_args(argv)
    manifest = build_tasks(args.source, args.out, TaskDataConfig(n_per_source=args.n_per_source, seed=args.seed))
    print(json.dumps(manifest["files"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
