"""Write ``glue_tiny``: a synthetic English-like language's corpus and two GLUE tasks in GLUE's layout.

A small language, a masked-LM corpus in it, and SST-2-like and RTE-like tasks in GLUE's official
files, so that the pretrain-then-fine-tune pipeline runs on a CPU in minutes.

    python -m tasks.glue.generate data/glue_tiny                    # the defaults
    python -m tasks.glue.generate data/glue_tiny --seed 1 --sst2-train 4000

What ``<root>`` holds::

    vocab.txt                                  the language's WordPiece vocabulary (BERT's format)
    corpus/train-00000-of-00001.parquet        one column ``text``: a document of 3 to 7 sentences
    corpus/validation-00000-of-00001.parquet   (corpus_docs // 10 documents)
    glue_data/SST-2/{train,dev,test}.tsv       header sentence<TAB>label; test: index<TAB>sentence
    glue_data/RTE/{train,dev,test}.tsv         index<TAB>sentence1<TAB>sentence2<TAB>label (test: no label)
    generator.json                             the spec, written last (:mod:`src.engine.generated`)

The language: lower-case words separated by spaces, a sentence ends with `` .``; a clause is
``the [adj]* noun verb the [adj]* noun [preposition the [adj]* place]``, e.g. ``the happy cat
sees the old dog near the river .``; its adjectives are positive, negative or neutral.

* **SST-2**: label 1 (positive) iff the sentence has more positive than negative adjectives, the
  other way round when its verb is negated (``does not see``, a quarter of the sentences). The
  number of sentiment adjectives (1 to 3), of neutral ones, the prepositional phrase and the
  negation are drawn independently of the label, so the sentence's length says nothing about it.
  The adjectives' balance alone gives 75% (a bag of words does no better); the rest needs the
  negation's flip. Why a quarter: with half the sentences negated the balance alone says nothing
  (the label is their XOR), and a small model trained from scratch stays near 67% after 300 steps.
* **RTE**: the premise is a clause whose verb has an adverb, ``always`` or (a quarter of the
  premises) ``never``; the hypothesis restates it, ``the X <adverb> verb the Y .``, and is
  ``entailment`` iff its adverb is the premise's. Half the pairs entail. The hypothesis's adverb
  alone gives 75% (it is mostly ``always`` when it entails); the rest needs the premise's. Both
  sentences always have one adverb, so length says nothing. [reading] An earlier rule (the
  hypothesis's nouns in the premise's roles) was not learnt by ``crammed_bert_micro`` in the
  fine-tuning budget (training loss flat at ln 2 for 750 steps, pretrained or not): comparing two
  sentences' nouns takes a small model much longer than a CPU check allows.

Baselines on the default sizes (tests/tasks/test_glue_metrics.py): the word counts alone give about
0.5 on both tasks; a bag of words about 0.75 on each. The pipeline of ``experiment=glue_tiny``
(``mlm_tiny``, then 5 epochs of fine-tuning) reaches, over 3 seeds, 0.988 (SST-2) and 1.0 (RTE)
with ``standard``, and means between 0.69 and 1.0 with the other variants.

The corpus uses the same words and clauses, so that masked-LM pretraining can help the tasks: a
document keeps one mood (its sentences are SST-2 sentences of one label: the polarities of the
adjectives, and the negation's flip, show in which words occur together) and restates some of its
clauses as ``the X <adverb> verb the Y .`` (RTE's entailment). The corpus, SST-2 and RTE are drawn
from streams of their own (seeded by ``seed`` and their name): changing one's size leaves the others
as they were.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from src.command import command_parser, run_command
from src.engine.generated import ensure_generated

NOUNS = (
    "cat", "dog", "bird", "fox", "horse", "child", "farmer", "teacher",
    "baker", "sailor", "king", "queen", "wolf", "mouse", "girl", "boy",
)  # fmt: skip
PLACES = ("river", "house", "garden", "market", "forest", "bridge", "school", "hill")
VERBS = (
    ("see", "sees"), ("follow", "follows"), ("help", "helps"), ("find", "finds"), ("meet", "meets"),
    ("watch", "watches"), ("call", "calls"), ("visit", "visits"), ("greet", "greets"), ("chase", "chases"),
)  # fmt: skip
POSITIVE = ("good", "happy", "kind", "bright", "lovely", "brave", "gentle", "clever")
NEGATIVE = ("bad", "sad", "cruel", "dull", "awful", "angry", "lazy", "rude")
NEUTRAL = ("small", "old", "big", "young", "tall", "brown", "gray", "little")
PREPOSITIONS = ("near", "under", "behind", "beside", "past", "by")
#: SST-2's splits of k sentiment adjectives into (positive, negative) with a positive majority.
MAJORITIES = {1: ((1, 0),), 2: ((2, 0),), 3: ((3, 0), (2, 1))}
NEGATION_P = 0.25  # the share of SST-2 sentences whose verb is negated (see the docstring)
NEVER_P = 0.25  # the share of RTE premises (and of the corpus's clauses) whose verb says ``never``
MARKER = "generator.json"
#: The version of the language and its rules, kept in the marker: a change regenerates the data.
RULES = 3
FILES = (
    "vocab.txt",
    "corpus/train-00000-of-00001.parquet",
    "corpus/validation-00000-of-00001.parquet",
    *(f"glue_data/{task}/{split}.tsv" for task in ("SST-2", "RTE") for split in ("train", "dev", "test")),
)


@dataclass(frozen=True)
class GlueTinySpec:
    """Sizes of ``glue_tiny``: corpus documents (and a tenth as many for its validation split),
    the training examples of each task, and the dev and test examples of each."""

    seed: int = 0
    corpus_docs: int = 4000
    sst2_train: int = 2000
    rte_train: int = 2000
    dev: int = 400
    test: int = 400


def noun_phrase(noun: str, adjectives: list[str]) -> str:
    """``the <adjectives> <noun>``."""
    return " ".join(["the", *adjectives, noun])


def clause(rng: random.Random, slots: list[list[str]], nouns: tuple[str, str], verb: str) -> str:
    """``subject verb object [preposition place]``: ``slots`` holds the adjectives of the subject, the
    object and, when there are three, the place."""
    words = [noun_phrase(nouns[0], slots[0]), verb, noun_phrase(nouns[1], slots[1])]
    if len(slots) == 3:
        words += [rng.choice(PREPOSITIONS), noun_phrase(rng.choice(PLACES), slots[2])]
    return " ".join(words)


def spread(rng: random.Random, adjectives: list[str], count: int) -> list[list[str]]:
    """``adjectives`` spread over ``count`` noun phrases, at most two each, in random order."""
    slots: list[list[str]] = [[] for _ in range(count)]
    for adjective in rng.sample(adjectives, len(adjectives)):
        rng.choice([s for s in slots if len(s) < 2]).append(adjective)
    return slots


def sst2_sentence(rng: random.Random, label: int) -> str:
    """A sentence whose SST-2 label is ``label`` (the rule in the module's docstring)."""
    negated = rng.random() < NEGATION_P
    positive, negative = rng.choice(MAJORITIES[rng.randint(1, 3)])
    if label == negated:  # a negative sentence, or a negated positive one: a negative majority
        positive, negative = negative, positive
    adjectives = rng.choices(POSITIVE, k=positive) + rng.choices(NEGATIVE, k=negative)
    adjectives += rng.choices(NEUTRAL, k=rng.randint(0, 1))
    slots = spread(rng, adjectives, rng.choice((2, 3)))
    base, third = rng.choice(VERBS)
    return clause(rng, slots, tuple(rng.sample(NOUNS, 2)), f"does not {base}" if negated else third) + " ."


def premise(rng: random.Random, pool: tuple[str, ...]) -> tuple[str, str, str, str]:
    """A clause with up to one adjective from ``pool`` per noun phrase and an adverb before its verb
    (``never`` with probability :data:`NEVER_P`, else ``always``): (text, subject, verb, object), the
    verb with its adverb."""
    subject, obj = rng.sample(NOUNS, 2)
    verb = f"{'never' if rng.random() < NEVER_P else 'always'} {rng.choice(VERBS)[1]}"
    slots = [rng.choices(pool, k=rng.randint(0, 1)) for _ in range(rng.choice((2, 3)))]
    return clause(rng, slots, (subject, obj), verb) + " .", subject, verb, obj


def rte_pair(rng: random.Random, kind: str) -> tuple[str, str, str]:
    """(premise, hypothesis, label); ``kind`` is ``entail`` (the clause restated) or ``contradict``
    (restated with the other adverb: ``never`` for ``always`` and the other way round)."""
    text, subject, verb, obj = premise(rng, POSITIVE + NEGATIVE + NEUTRAL)
    if kind == "contradict":
        adverb, third = verb.split()
        verb = f"{'always' if adverb == 'never' else 'never'} {third}"
    label = "entailment" if kind == "entail" else "not_entailment"
    return text, f"the {subject} {verb} the {obj} .", label


def document(rng: random.Random) -> str:
    """3 to 6 sentences of one mood: SST-2 sentences of one label, and clauses restated."""
    mood = rng.randint(0, 1)
    pool = (POSITIVE if mood else NEGATIVE) + NEUTRAL
    sentences: list[str] = []
    count = rng.randint(3, 6)
    while len(sentences) < count:  # a clause and its restatement may make it count + 1
        if rng.random() < 0.35:
            text, subject, verb, obj = premise(rng, pool)
            sentences += [text, f"the {subject} {verb} the {obj} ."]
        else:
            sentences.append(sst2_sentence(rng, mood))
    return " ".join(sentences)


def distinct(rng: random.Random, labels: list, make: Callable[[random.Random, object], tuple]) -> list[tuple]:
    """One example of each label of ``labels`` (in order), none twice: a repeat is drawn again."""
    seen: set[tuple] = set()
    examples = []
    for label in labels:
        example = make(rng, label)
        while example in seen:
            example = make(rng, label)
        seen.add(example)
        examples.append(example)
    return examples


def balanced(rng: random.Random, values: tuple, count: int) -> list:
    """``count`` labels cycling through ``values``, shuffled: each as often as the count allows."""
    labels = [values[i % len(values)] for i in range(count)]
    rng.shuffle(labels)
    return labels


def write_tsv(path: Path, rows: list[list[str]]) -> None:
    """A TSV file as GLUE's: cells joined by tabs, no quoting, every line ending in a newline."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(cells) + "\n" for cells in rows), encoding="utf-8")


def write_task(folder: Path, examples: list[tuple], train: int, dev: int, pair: bool) -> None:
    """train, dev and test of one task from ``examples`` (texts..., label), in GLUE's columns:
    SST-2 ``sentence label`` (test ``index sentence``), RTE ``index sentence1 sentence2 label``
    (test without the label)."""
    parts = {"train": examples[:train], "dev": examples[train : train + dev], "test": examples[train + dev :]}
    for split, rows in parts.items():
        test = split == "test"
        index = pair or test  # SST-2's train and dev have no index column
        texts = ["sentence1", "sentence2"] if pair else ["sentence"]
        header = ["index"] * index + texts + ["label"] * (not test)
        lines = [
            [str(i)] * index + list(row[:-1]) + [str(row[-1])] * (not test) for i, row in enumerate(rows)
        ]
        write_tsv(folder / f"{split}.tsv", [header, *lines])


def write_vocabulary(path: Path) -> None:
    """The language's WordPiece vocabulary in BERT's ``vocab.txt`` format, the same on every machine:
    the five special tokens (ids 0 to 4, as ``tasks.mlm.wordpiece`` orders them), every word and the
    full stop whole, then every letter alone and as a ``##`` continuation (for words the language
    lacks). [reading] ``mlm_tiny`` reads it (``task.tokenizer=bert``) instead of training a WordPiece:
    Hugging Face's trainer breaks ties in hash order, so two trainings on the same corpus give
    different vocabularies, and the pipeline's numbers would differ from one data folder to the next."""
    words = {*NOUNS, *PLACES, *(w for pair in VERBS for w in pair), *POSITIVE, *NEGATIVE, *NEUTRAL}
    words |= {*PREPOSITIONS, "the", "does", "not", "always", "never", "."}
    letters = sorted({c for w in words for c in w} | set("abcdefghijklmnopqrstuvwxyz"))
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted(words)]
    tokens += [c for c in letters if c not in words] + [f"##{c}" for c in letters]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")


def write_glue_tiny(root: Path, spec: GlueTinySpec) -> dict[str, int]:
    """Writes every file of ``glue_tiny`` under ``root``; returns the corpus's document counts (for
    the marker). Each split's labels are balanced on their own."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_vocabulary(root / "vocab.txt")
    rng = random.Random(f"{spec.seed}-corpus")
    docs = [document(rng) for _ in range(spec.corpus_docs + spec.corpus_docs // 10)]
    (root / "corpus").mkdir(parents=True, exist_ok=True)
    parts = {"train": docs[: spec.corpus_docs], "validation": docs[spec.corpus_docs :]}
    for split, texts in parts.items():
        pq.write_table(pa.table({"text": texts}), root / "corpus" / f"{split}-00000-of-00001.parquet")
    rng = random.Random(f"{spec.seed}-sst2")
    labels = [v for n in (spec.sst2_train, spec.dev, spec.test) for v in balanced(rng, (0, 1), n)]
    sst2 = distinct(rng, labels, lambda r, label: (sst2_sentence(r, label), label))
    write_task(root / "glue_data" / "SST-2", sst2, spec.sst2_train, spec.dev, pair=False)
    rng = random.Random(f"{spec.seed}-rte")
    cycle = ("entail", "contradict")
    kinds = [k for n in (spec.rte_train, spec.dev, spec.test) for k in balanced(rng, cycle, n)]
    rte = distinct(rng, kinds, rte_pair)
    write_task(root / "glue_data" / "RTE", rte, spec.rte_train, spec.dev, pair=True)
    return {"corpus_train": len(parts["train"]), "corpus_validation": len(parts["validation"])}


def ensure_glue_tiny(root: Path, spec: GlueTinySpec) -> Path:
    """``glue_tiny`` of ``spec`` under ``root``, generated unless it is there (its spec is kept in
    ``generator.json``; another spec generates it again); returns ``root``. Files there without
    ``generator.json`` are the user's own and are used as they are."""
    root = Path(root)

    def damage(saved: dict) -> str | None:
        missing = [name for name in FILES if not (root / name).is_file()]
        return f"missing {', '.join(missing)}" if missing else None

    ensure_generated(
        root / MARKER,
        {**dataclasses.asdict(spec), "rules": RULES},
        lambda: write_glue_tiny(root, spec),
        damage,
        present=lambda: all((root / name).is_file() for name in FILES),
        what=f"glue_tiny (SST-2 and RTE, {spec.sst2_train:,} / {spec.rte_train:,} train, {spec.dev:,} dev)",
    )
    return root


def main(argv: list[str] | None = None) -> int:
    """``python -m tasks.glue.generate <folder> [--seed N --corpus-docs N ...]``."""
    parser = command_parser(__spec__.name, __doc__)
    parser.add_argument("folder", type=Path)
    for f in dataclasses.fields(GlueTinySpec):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=int, default=f.default)
    return run_command(parser, generate_into, argv)


def generate_into(args: argparse.Namespace) -> None:
    """The command's work: ``glue_tiny`` written into ``args.folder``."""
    spec = vars(args).copy()
    folder = spec.pop("folder")
    ensure_glue_tiny(folder, GlueTinySpec(**spec))
    print(f"glue_tiny in {folder}: vocab.txt, corpus/, glue_data/SST-2/, glue_data/RTE/ ({folder / MARKER})")


if __name__ == "__main__":
    raise SystemExit(main())
