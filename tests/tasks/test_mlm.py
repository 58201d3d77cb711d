"""Masked-LM pretraining: the WordPiece tokenizer, BERT's masking, the sparse loss, the resumable
mask stream, the corpus's messages and the embedded ``task=mlm_tiny`` composed from the real config."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import CONF, compose
from smoke.lm import documents, write_parquet
from torch import nn

from src.errors import ConfigError, DataError
from tasks.mlm import SPECIALS, MaskedLM, WordPieceTokenizer, load_bert_vocab, pretrained_tokenizer
from tasks.mlm.masking import draw as masking_draw
from tasks.mlm.masking import indexed_mask_tokens, mask_tokens, unwrap
from tasks.mlm.masking import selection_bound as select_count
from tasks.mlm.wordpiece import truncate_pair

SMALL = {"name": "mlm", "input": "text", "batch_size": 4, "eval_batch_size": 4, "seq_len": 32}


def mlm(**kw) -> MaskedLM:
    return MaskedLM(**{**SMALL, "folder": "corpus", "val_split": "validation", "vocab_size": 300, **kw})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A data folder with ``corpus/{train,validation}-00000-of-00001.parquet`` (pydoc topics) and
    the WordPiece an ``mlm`` task trains on it."""
    root = tmp_path_factory.mktemp("data")
    train, val = documents()
    write_parquet(root / "corpus", {"train": train, "validation": val})
    mlm().datasets(root)
    return root


@pytest.fixture(scope="module")
def tokenizer(corpus) -> WordPieceTokenizer:
    task = mlm()
    task.datasets(corpus)
    return task.tokenizer


class StandIn(nn.Module):
    """The two methods of CrammedBERT that the task calls: an embedding and a linear decoder."""

    def __init__(self, vocab_size: int, dim: int = 8) -> None:
        super().__init__()
        self.embed, self.decoder = nn.Embedding(vocab_size, dim), nn.Linear(dim, vocab_size)
        self.seen: list[torch.Tensor] = []

    def encode(self, ids, pad_mask=None):  # (B, N) -> (B, N, D)
        self.seen.append(ids.clone())
        return self.embed(ids)

    def mlm_logits(self, hidden):  # (..., D) -> (..., V)
        return self.decoder(hidden)

    def forward(self, ids, pad_mask=None):
        return self.mlm_logits(self.encode(ids, pad_mask))


# -- WordPiece ---------------------------------------------------------------------------------


def test_wordpiece_lowercases_strips_accents_and_puts_the_specials_first(tokenizer, corpus):
    assert [tokenizer.tokenizer.token_to_id(t) for t in SPECIALS] == [0, 1, 2, 3, 4]
    assert (tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id) == (0, 2, 3, 4)
    assert tokenizer.eot == tokenizer.sep_id and tokenizer.vocab_size == 300
    (ids,) = tokenizer.encode_batch(["The Café RETURNS a Value"])
    assert tokenizer.decode(ids) == "the cafe returns a value"
    assert not set(ids) & set(tokenizer.special_ids)  # no [CLS] or [SEP] in the corpus encoding
    again = WordPieceTokenizer.from_str(tokenizer.to_str())
    assert again.fingerprint == tokenizer.fingerprint and again.encode_batch(
        ["The Café RETURNS a Value"]
    ) == [ids]
    saved = corpus / "cache" / "mlm" / "corpus" / "wordpiece-300" / "tokenizer.json"
    assert saved.is_file() and (saved.parent / "trained.json").is_file()


def test_pair_encoding_has_bert_layout_and_truncates_longest_first(tokenizer):
    a, b = tokenizer.encode_batch(["one two three", "four five"])
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    single, pair = tokenizer.encode_examples([("one two three",), ("one two three", "four five")], 32)
    assert single == [cls, *a, sep] and pair == [cls, *a, sep, *b, sep]
    for max_len in (len(a) + len(b) + 2, 6, 3):  # too long by one; shorter; room for the specials only
        (cut,) = tokenizer.encode_examples([("one two three", "four five")], max_len)
        kept_a, kept_b = bert_truncation(a, b, max_len - 3)
        assert cut == [cls, *kept_a, sep, *kept_b, sep] and len(cut) == max_len
    (short,) = tokenizer.encode_examples([("one two three " * 20,)], 10)
    assert len(short) == 10 and short[0] == cls and short[-1] == sep


def bert_truncation(a: list, b: list, budget: int) -> tuple[list, list]:
    """BERT's ``_truncate_seq_pair`` as written there: one id at a time from the longer."""
    a, b = list(a), list(b)
    while len(a) + len(b) > budget:
        (a if len(a) > len(b) else b).pop()
    return a, b


@pytest.mark.parametrize("budget", [0, 1, 5, 8, 13])
def test_truncate_pair_matches_berts_loop(budget):
    for la in range(0, 12):
        for lb in range(0, 12):
            a, b = list(range(la)), list(range(100, 100 + lb))
            assert truncate_pair(a, b, budget) == bert_truncation(a, b, budget), (la, lb)


def test_bert_vocab_is_read_and_its_absence_explained(tmp_path):
    folder = tmp_path / "tokenizers" / "bert-base-uncased"
    with pytest.raises(DataError) as missing:
        load_bert_vocab(folder)
    for piece in (
        f"{folder}/tokenizer.json",
        f"{folder}/vocab.txt",
        "hf download google-bert/bert-base-uncased",
    ):
        assert piece in str(missing.value)
    assert "task.tokenizer=wordpiece" in str(missing.value)
    folder.mkdir(parents=True)
    words = ["[PAD]", "hello", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "world", "##s", "."]
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    bert = load_bert_vocab(folder)
    assert bert.name == "bert" and bert.special_ids == (0, 2, 3, 4, 5)
    assert bert.encode_batch(["Hello Worlds."]) == [[1, 6, 7, 8]]


# -- masking ---------------------------------------------------------------------------------


def sample_ids(rows: int = 256, n: int = 128, vocab: int = 1000, seed: int = 0) -> torch.Tensor:
    """Ordinary ids with a [SEP] (3) every 16 tokens and [CLS] (2), [PAD] (0) at the starts and ends."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (rows, n), generator=g)
    ids[:, ::16], ids[:, 0], ids[:, -4:] = 3, 2, 0
    return ids


def test_masking_follows_berts_rates_and_never_touches_specials():
    ids, specials, prob = sample_ids(), (0, 1, 2, 3, 4), 0.15
    inputs, mask = mask_tokens(ids, prob, 1000, specials, 4, torch.Generator().manual_seed(1))
    ordinary = ~torch.isin(ids, torch.tensor(specials))
    assert not mask[~ordinary].any() and torch.equal(inputs[~ordinary], ids[~ordinary])
    n = int(ordinary.sum())
    rate = mask.sum().item() / n
    assert abs(rate - prob) < 4 * math.sqrt(prob * (1 - prob) / n)
    selected = int(mask.sum())
    masked = (inputs == 4) & mask
    randomised = (inputs != ids) & (inputs != 4)
    assert not (randomised & ~mask).any() and not (inputs != ids)[~mask].any()  # only selected ones change
    for share, expected in (
        (masked.sum() / selected, 0.8),
        (randomised.sum() / selected, 0.1 * (1 - 1 / 995)),
    ):
        assert abs(share.item() - expected) < 4 * math.sqrt(expected * (1 - expected) / selected)
    assert not torch.isin(inputs[randomised], torch.tensor(specials)).any()


def test_the_same_generator_state_gives_the_same_masks():
    ids, g = sample_ids(8), torch.Generator().manual_seed(5)
    state = g.get_state()
    first = mask_tokens(ids, 0.15, 1000, (0, 1, 2, 3, 4), 4, g)
    second = mask_tokens(ids, 0.15, 1000, (0, 1, 2, 3, 4), 4, g)
    g.set_state(state)
    again = mask_tokens(ids, 0.15, 1000, (0, 1, 2, 3, 4), 4, g)
    assert all(torch.equal(x, y) for x, y in zip(first, again, strict=True))
    assert not torch.equal(first[1], second[1])  # the stream moves on


def test_evaluation_masks_depend_on_the_sample_index_alone():
    ids, args = sample_ids(6), (0.15, 1000, (0, 1, 2, 3, 4), 4)
    whole = indexed_mask_tokens(ids, torch.arange(6), *args)
    assert all(
        torch.equal(x, y)
        for x, y in zip(whole, indexed_mask_tokens(ids, torch.arange(6), *args), strict=True)
    )
    alone = indexed_mask_tokens(ids[4:5], [4], *args)  # sample 4 in a batch of its own
    assert torch.equal(alone[0], whole[0][4:5]) and torch.equal(alone[1], whole[1][4:5])
    assert not torch.equal(whole[1][0], whole[1][1])


# -- the task -----------------------------------------------------------------------------------


def test_sequences_are_packed_with_sep_and_validation_is_fixed(corpus, tokenizer):
    task = mlm()
    train, val = task.datasets(corpus)
    ids, index = val[2]
    assert ids.dtype == torch.int64 and ids.shape == (32,) and index == 2
    docs = np.asarray(val.tokens)
    ends = np.flatnonzero(docs == tokenizer.sep_id)
    assert len(ends) == len(documents()[1]) and ends[-1] == len(docs) - 1  # one [SEP] after each document
    assert tokenizer.cls_id not in docs
    batch = task.collate_fn([val[i] for i in range(4)])
    model = StandIn(tokenizer.vocab_size)
    first, second = task.eval_sums(model, batch), task.eval_sums(model, batch)
    assert first["val/loss"][0].item() == second["val/loss"][0].item()
    assert first["val/loss"][1] == first["val/acc"][1] > 0
    assert torch.equal(model.seen[0], model.seen[1])
    assert task.derived_metrics({"val/loss": 2.0})["val/ppl"] == pytest.approx(math.exp(2.0))


def test_held_out_validation_is_the_end_of_the_train_split(corpus):
    task = mlm(val_split=None, val_fraction=0.1)
    train, val = task.datasets(corpus)
    total = len(train.tokens) // 32
    assert len(val) == round(total * 0.1) and len(train) + len(val) == total
    assert torch.equal(
        val[0][0], torch.from_numpy(np.asarray(train.tokens[len(train) * 32 :][:32], np.int64))
    )
    reopened = pickle.loads(pickle.dumps(val))  # as a DataLoader worker gets it
    assert reopened._tokens is None and torch.equal(reopened[1][0], val[1][0])


def test_the_loss_is_the_dense_cross_entropy_at_the_masked_positions(corpus, tokenizer):
    task = mlm()
    train, _ = task.datasets(corpus)
    batch = task.collate_fn([train[i] for i in range(4)])
    model, state = StandIn(tokenizer.vocab_size), task.generator.get_state()
    loss = task.train_loss(model, batch)
    task.generator.set_state(state)
    inputs, mask = mask_tokens(batch[0], 0.15, tokenizer.vocab_size, tokenizer.special_ids, 4, task.generator)
    assert torch.equal(model.seen[0], inputs) and mask.sum() > 0
    dense = F.cross_entropy(model(inputs).flatten(0, 1), batch[0].flatten(), reduction="none")  # (B·N,)
    assert loss.item() == pytest.approx(dense[mask.flatten()].mean().item(), rel=1e-6)
    assert loss.item() != pytest.approx(dense.mean().item(), rel=1e-3)


def boolean_masked_loss(model: nn.Module, ids, inputs, mask) -> torch.Tensor:
    """The loss as the task computed it before: the masked states picked by the boolean mask, whose
    result's shape depends on the values (a host sync per micro-batch on a GPU)."""
    logits = model.mlm_logits(model.encode(inputs)[mask]).float()  # (M, V)
    return F.cross_entropy(logits, ids[mask], reduction="sum") / mask.sum().clamp_min(1)


class Compiled(nn.Module):
    """Stands for a compiled (or DDP) wrapper: ``unwrap`` sees through it, and the loss takes the
    dense path through its ``forward``."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self._orig_mod = inner

    def forward(self, ids):
        return self._orig_mod(ids)


def test_the_sync_free_loss_is_the_boolean_masked_one_and_makes_no_device_read(tokenizer, monkeypatch):
    """Cramming's micro-batch (128 sequences of 128 tokens, 40 of them drawn): the loss gathered at a
    bound known on the host equals the boolean-masked loss, on the bare model's sparse path and a
    wrapper's dense one; the bound is every masked position plus the specials drawn under mask_prob
    (here 10% of the tokens are specials; packed Wikipedia has a [SEP] per document, so the decoder
    sees under 1% more positions); and the step reads nothing on the device and
    has no data-dependent shape (the CPU generator's draws, host work, left out), where the
    boolean-masked loss had two such ops."""
    from syncs import SyncAudit

    import tasks.mlm.task as module

    task, model = mlm(seq_len=128), StandIn(tokenizer.vocab_size)
    task.tokenizer, audit = tokenizer, SyncAudit()
    monkeypatch.setattr(module, "draw", lambda *a: audit_paused(audit, masking_draw, *a))
    monkeypatch.setattr(module, "selection_bound", lambda *a: audit_paused(audit, select_count, *a))
    for b in range(40):
        ids = sample_ids(128, 128, tokenizer.vocab_size, seed=b)
        state = task.generator.get_state()
        with audit.active(monkeypatch):
            loss = task.train_loss(model, (ids, torch.arange(128)))
        assert audit.events == [], audit.events
        task.generator.set_state(state)
        wrapped = task.train_loss(Compiled(model), (ids, torch.arange(128)))
        task.generator.set_state(state)
        inputs, mask = mask_tokens(ids, 0.15, tokenizer.vocab_size, tokenizer.special_ids, 4, task.generator)
        with audit.active(monkeypatch):
            before = boolean_masked_loss(model, ids, inputs, mask)
        assert audit.names() == {"index": 2}  # states[mask] and ids[mask]
        audit.events.clear()
        torch.testing.assert_close(loss, before, rtol=1e-6, atol=0)
        torch.testing.assert_close(wrapped, before, rtol=1e-6, atol=0)
        task.generator.set_state(state)
        select = masking_draw(ids.shape, tokenizer.vocab_size, tokenizer.special_ids, task.generator)[0]
        drawn_specials = (select < 0.15) & torch.isin(ids, torch.tensor(tokenizer.special_ids))
        task.generator.set_state(state)
        assert task.masks(ids)[2] == int(mask.sum()) + int(drawn_specials.sum())  # the extra positions


def audit_paused(audit, function, *args):
    with audit.paused():
        return function(*args)


def test_wrapped_models_are_unwrapped_for_evaluation():
    model = StandIn(10)
    assert unwrap(model) is model and unwrap(torch.compile(model)) is model


def test_state_dict_resumes_the_mask_stream_and_carries_the_tokenizer(corpus, tokenizer):
    task = mlm()
    train, _ = task.datasets(corpus)
    batch = task.collate_fn([train[i] for i in range(4)])
    straight, model = mlm(mask_seed=7), StandIn(tokenizer.vocab_size)
    straight.datasets(corpus)
    straight.train_loss(model, batch)
    saved = pickle.loads(pickle.dumps(straight.state_dict()))  # as a checkpoint keeps it
    for _ in range(2):
        straight.train_loss(model, batch)
    resumed, other = mlm(mask_seed=7), StandIn(tokenizer.vocab_size)
    resumed.datasets(corpus)
    resumed.load_state_dict(saved)
    for _ in range(2):
        resumed.train_loss(other, batch)
    assert all(torch.equal(x, y) for x, y in zip(model.seen[1:], other.seen, strict=True))
    assert not torch.equal(model.seen[0], model.seen[1])
    assert (
        saved["tokenizer_name"] == "wordpiece"
        and pretrained_tokenizer(saved).fingerprint == tokenizer.fingerprint
    )
    fresh = mlm(mask_seed=7)
    fresh.datasets(corpus)
    fresh.train_loss(StandIn(tokenizer.vocab_size), batch)
    assert torch.equal(fresh.generator.get_state(), saved["mask_generator"])  # the seed decides the stream


def test_a_missing_corpus_says_where_it_looked_and_that_the_vocabulary_needs_no_download(tmp_path):
    with pytest.raises(DataError) as missing:
        MaskedLM(**SMALL).datasets(tmp_path)
    message = str(missing.value)
    for piece in (
        f"{tmp_path}/wikipedia/20231101.en/train-*.parquet",
        "load_dataset('wikimedia/wikipedia', '20231101.en')",
        "task.tokenizer=wordpiece (the default) trains it offline",
    ):
        assert piece in message
    with pytest.raises(DataError) as both:
        MaskedLM(**SMALL, tokenizer="bert").datasets(tmp_path)
    for piece in ("BERT's vocabulary is missing too", "hf download google-bert/bert-base-uncased vocab.txt"):
        assert piece in str(both.value)
    assert "offline, task.tokenizer=wordpiece" in str(both.value)


def test_a_corpus_without_the_text_column_names_the_file_and_its_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "corpus").mkdir()
    file = tmp_path / "corpus" / "train-00000-of-00001.parquet"
    pq.write_table(pa.table({"content": ["a b c"], "id": [1]}), file)
    with pytest.raises(DataError, match=f"{file} has no column 'text' \\(columns: content, id\\)"):
        mlm(val_split=None).datasets(tmp_path)


def test_bad_options_are_one_config_error_each():
    with pytest.raises(ConfigError, match="task.tokenizer='gpt2': choose one of wordpiece, bert"):
        MaskedLM(**SMALL, tokenizer="gpt2")
    with pytest.raises(ConfigError, match="task.mask_prob=1.5"):
        MaskedLM(**SMALL, mask_prob=1.5)
    with pytest.raises(ConfigError, match="task.generate needs root"):
        MaskedLM(**SMALL, generate={"seed": 1}).datasets(Path("unused"))


# -- the real configs ---------------------------------------------------------------------------


def test_the_mlm_config_is_crammings_recipe(tmp_path):
    cfg = compose(["task=mlm", "seed=3"], tmp_path)
    assert cfg.task.mask_seed == 3 and cfg.task.mask_prob == 0.15 and cfg.task.vocab_size == 32768
    assert cfg.backbone.name == "crammed_bert" and cfg.backbone.model.drop == 0.0
    assert cfg.task.batch_size * cfg.trainer.accumulate == 8192 and cfg.trainer.max_steps == 4300
    assert (cfg.optim.lr, list(cfg.optim.betas), cfg.optim.eps, cfg.optim.weight_decay) == (
        1e-3,
        [0.9, 0.98],
        1e-12,
        0.01,
    )
    assert cfg.sched._target_.endswith("TriangleLRScheduler") and cfg.trainer.clip_grad == 0.5
    assert "[reading]" in (CONF / "task" / "mlm.yaml").read_text()


@pytest.mark.skipif(
    not (CONF / "backbone" / "crammed_bert_micro.yaml").is_file(), reason="crammed_bert_micro not written yet"
)
def test_mlm_tiny_composes_builds_and_starts_near_uniform(tmp_path):
    from hydra.utils import instantiate

    cfg = compose(["task=mlm_tiny", f"paths.data_dir={tmp_path}"], tmp_path)
    task = instantiate(cfg.task, _convert_="all")
    train, val = task.datasets(Path(cfg.paths.data_dir))
    assert (tmp_path / "glue_tiny" / "corpus" / "train-00000-of-00001.parquet").is_file()
    pieces = [task.tokenizer.tokenizer.id_to_token(i) for i in np.asarray(train.tokens[:5000]).tolist()]
    assert not [p for p in pieces if p.startswith("##")]  # the vocabulary holds every word whole
    assert len(train) > 1000 and len(val) > 100
    model = task.build_model(cfg.backbone)
    batch = task.collate_fn([train[i] for i in range(cfg.task.batch_size)])
    loss = task.train_loss(model, batch)
    assert math.isfinite(loss.item()) and abs(loss.item() - math.log(task.tokenizer.vocab_size)) < 0.3
