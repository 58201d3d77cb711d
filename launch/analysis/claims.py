"""The papers' claims as data: what each says, how the suite measures it, where it is tested.

Each :class:`Claim` says who claims what (``source``, ``statement``), how the suite measures it
(``measure``, ``better``), where it is tested at small scale (``tasks`` and the ``experiment``
that runs them) and the paper's number where one exists. The measures, and how runs turn into a
verdict per claim, task and reading, are :mod:`launch.analysis.verdicts`' (kept apart so that this list
reads on its own); P5's, measured over seeds trained at once, :mod:`launch.analysis.seed_verdicts`';
a claim's ``measure`` is a name registered in :mod:`launch.analysis.measures`.

Claims that need no training (theorems) are checked by tests; they are listed here with the
test that asserts them and what it found (:data:`CHECKED_BY_TESTS`). :func:`parse_margins` reads a
command's ``--margin KEY=δ`` (``launch.analysis.report``, ``launch.analysis.settle``) against this list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .stats import SHARE_MARGIN

Better = Literal["metric", "higher", "lower"]
#: what a claim says of its effect: *superiority* (an effect on the paper's side: reproduced,
#: contradicted, or equivalent inside ±δ) or *non-inferiority* ("at least as good": not worse by
#: more than δ, a one-sided test of effect > −δ)
Kind = Literal["superiority", "non-inferiority"]
#: how every accuracy margin below is carried: the paper's gain in accuracy points at its own
#: scale, applied unchanged as an absolute difference of accuracy (never converted, e.g. to a
#: relative error reduction, which would scale it by the task's error rate)
CARRIED = (
    "accuracy points, carried unchanged as an absolute difference "
    "(not converted, e.g. to a relative error reduction)"
)


#: measures judged only from seed sets and memory runs (launch/analysis/seed_verdicts.py), never from records
SEED_SET_MEASURES = ("learns_first", "spike_curvature", "clustering_first", "curriculum", "init_source")
#: those judged by a sign test, whose margin is a share of the discordant seeds away from one half
SHARE_MEASURES = ("learns_first", "clustering_first", "curriculum")


@dataclass(frozen=True)
class Claim:
    """One testable statement of a paper."""

    key: str
    source: str  # P1 … P5
    statement: str
    variant: str  # the variant it is about (``standard`` for P5's dynamics)
    # final | monitor:<key> (at init, during, at the end) | time_to_target | stages | learns_first |
    # spike_curvature | clustering_first | curriculum | init_source (SEED_SET_MEASURES)
    measure: str
    better: Better  # metric: the task's own direction; higher / lower: of the measure
    tasks: tuple[str, ...]  # the suite's tasks that test it at small scale
    experiment: str = (
        "readings"  # what runs them: conf/experiment/<it>/ (readings: <task>.yaml), or a command
    )
    paper: str = "—"  # the paper's number, as docs/methods.md quotes it
    # the smallest effect of interest δ, in the measure's units (accuracy as a fraction): an interval
    # inside ±δ says "no effect as large as the paper's" (*equivalent*). [reading] The paper's own
    # gain where it reports one in the same units; None where it reports none or in other units
    # (perplexity, κ, epochs), so that no equivalence is claimed. P5's sign tests (learns_first,
    # clustering_first, curriculum): the share of the discordant seeds' distance from one half,
    # SHARE_MARGIN ([reading]: P5 gives no number). `launch.analysis.report --margin KEY=δ` overrides it.
    # A non-inferiority claim's bound: the effect is tested against −δ (`kind`).
    margin: float | None = None
    # the *primary* reading (a conf/reading/ file), chosen from the paper's text before any run
    # (docs/methods.md, "Primary readings"): its row is the claim's answer; the others are
    # exploratory, and a reading quoted because it came out well is first confirmed on fresh seeds
    primary: str = "standard"
    # time_to_target's target, fixed before the runs: this fraction of standard's mean final metric
    # (``(2 − f) ×`` it for a metric that falls: "within 1 − f of where standard ends"; [reading])
    target_fraction: float | None = None
    kind: Kind = "superiority"
    # δ's unit and where it comes from: the paper's scale (its dataset and model) and, where it is
    # carried to another (a small task's), how: unchanged or converted, and by what rule
    margin_unit: str = ""

    def __post_init__(self) -> None:
        if self.kind == "non-inferiority" and self.margin is None:
            raise ValueError(f"claim {self.key}: a non-inferiority claim needs its margin δ")


IMAGE, LRA, LM, MODADD = ("digits",), ("lra_listops_small",), ("lm_char",), ("modadd",)

CLAIMS: list[Claim] = [
    Claim(
        "P2-image",
        "P2",
        "spectral conditioning improves image classification",
        "spectral",
        "final",
        "metric",
        IMAGE,
        paper="ImageNet ViT-B 80.7 → 81.7 (+0.6 to +1.0 on five backbones)",
        margin=0.006,  # the smallest of its five backbones' gains
        margin_unit=f"ImageNet top-1 (ViT-B and four other backbones): {CARRIED}",
        primary="spectral_qkv",
    ),
    Claim(
        "P2-lra",
        "P2",
        "spectral conditioning improves every LRA task",
        "spectral",
        "final",
        "metric",
        LRA,
        paper="ListOps 37.1 → 37.8",
        margin=0.007,
        margin_unit=f"ListOps accuracy (LRA): {CARRIED}",
        primary="spectral_qkv",
    ),
    Claim(
        "P2-kappa-W",
        "P2",
        "W + C is better conditioned than W (κ(W+C) ≤ 2 exact, Thm 3.5; κ(W+λI) < κ(W), Thm 3.8)",
        "spectral",
        "monitor:kappa/W_Q/median",
        "lower",
        IMAGE + LRA + LM,
        paper="κ(W + C) ≤ 2",
        primary="spectral_qkv",
    ),
    Claim(
        "P3-image",
        "P3",
        "conditioned embedded tokens improve image classification",
        "cond_tokens",
        "final",
        "metric",
        IMAGE,
        paper="ImageNet ViT-B 80.3 → 81.3",
        margin=0.010,
        margin_unit=f"ImageNet top-1 (ViT-B): {CARRIED}",
        primary="cond_tokens_block",
    ),
    Claim(
        "P3-lra",
        "P3",
        "conditioned embedded tokens improve every LRA task",
        "cond_tokens",
        "final",
        "metric",
        LRA,
        paper="ListOps 37.1 → 37.9",
        margin=0.008,
        margin_unit=f"ListOps accuracy (LRA): {CARRIED}",
        primary="cond_tokens_block",
    ),
    Claim(
        "P3-lm",
        "P3",
        "conditioned embedded tokens lower a language model's loss",
        "cond_tokens",
        "final",
        "metric",
        LM,
        paper="TinyStories GPT-2 val loss 2.41 → 2.36",
        primary="cond_tokens_embed",
    ),
    Claim(
        "P3-kappa-X",
        "P3",
        "the tokens entering the first layer are far better conditioned",
        "cond_tokens",
        "monitor:kappa/tokens/median",
        "lower",
        IMAGE + LRA,
        paper="κ(X) ≈ 10³ → ≈ 10¹",
        primary="cond_tokens_block",
    ),
    Claim(
        "P4-image",
        "P4",
        "conditioned initialization improves image classification",
        "cond_init",
        "final",
        "metric",
        IMAGE,
        paper="ImageNet ViT-B 80.3 → 81.5",
        margin=0.012,
        margin_unit=f"ImageNet top-1 (ViT-B): {CARRIED}",
        primary="cond_init_per_head",
    ),
    Claim(
        "P4-lra",
        "P4",
        "conditioned initialization improves LRA",
        "cond_init",
        "final",
        "metric",
        LRA,
        paper="Text 63.8 → 64.9 (no ListOps number)",
        margin=0.011,  # [reading] Text's gain stands in for ListOps'
        margin_unit=f"LRA Text accuracy, standing in for ListOps': {CARRIED}",
        primary="cond_init_per_head",
    ),
    Claim(
        "P4-lm",
        "P4",
        "conditioned initialization lowers a language model's perplexity",
        "cond_init",
        "final",
        "metric",
        LM,
        paper="TinyStories 472M ppl 2.39 → 2.20",
        primary="cond_init_per_head",
    ),
    Claim(
        "P4-speed",
        "P4",
        "conditioned initialization reaches the default's final metric in fewer steps",
        "cond_init",
        "time_to_target",
        "lower",
        IMAGE + LRA + LM,
        paper="0.70× the epochs (ImageNet); ListOps 0.75× the steps",
        target_fraction=0.95,  # [reading] 95% of standard's mean final: where both arms can arrive
        primary="cond_init_per_head",
    ),
    Claim(
        "P4-mimetic",
        "P4",
        "mimetic initialization is at least as good as the default",
        "mimetic",
        "final",
        "metric",
        IMAGE,
        paper="ImageNet ViT-B 80.3 → 80.5",
        margin=0.002,
        kind="non-inferiority",  # "at least as good": not worse by more than δ
        margin_unit=f"ImageNet top-1 (ViT-B): {CARRIED}",
        primary="mimetic",
    ),
    Claim(
        "P1-kappa-A",
        "P1",
        "the preconditioner lowers the condition number of the attention matrices",
        "precond",
        "monitor:kappa/A/median",
        "lower",
        IMAGE + LRA + LM,
        paper="no table could be read",
        primary="precond",
    ),
    Claim(
        "P1-train",
        "P1",
        "preconditioned attention trains better (its title: enhancing efficiency)",
        "precond",
        "final",
        "metric",
        IMAGE + LRA + LM,
        paper="no table could be read",
        primary="precond",
    ),
    Claim(
        "P5-stages",
        "P5",
        "learning has two stages: the embeddings organise, then a classifier fits "
        "(a plateau at chance, then a rise)",
        "standard",
        "stages",
        "higher",
        MODADD,
        paper="seen in every figure; no number",
    ),
    Claim(
        "P5-spikes",
        "P5",
        "loss spikes come from the curvature: a spike is a gradient step past 2/λ_max (P5's "
        "associative memory under full-batch gradient descent, η = 10 against 1)",
        "standard",
        "spike_curvature",
        "higher",
        MODADD,
        experiment="python -m src.sandbox.memory",
        paper="seen in its figures; no number",
    ),
    Claim(
        "P5-clustering",
        "P5",
        "the clustering head forms before the classifier fits: a seed's pooled token groups by the "
        "partial sum before the seed learns",
        "standard",
        "clustering_first",
        "higher",
        MODADD,
        experiment="paper/p5",
        paper="seen in its figures; no number",
        margin=SHARE_MARGIN,
    ),
    Claim(
        "P5-curriculum",
        "P5",
        "a curriculum helps: fine-tuned from the p = 2 model, p = 3 is learned sooner than from scratch "
        "(P5's fine-tuning, its code's finetune.py)",
        "standard",
        "curriculum",
        "lower",
        MODADD,
        experiment="paper/p5_curriculum",
        paper="seen in its figures; no number",
        margin=SHARE_MARGIN,
    ),
    Claim(
        "P5-init",
        "P5",
        "the initialization decides: started from a p = 2 model that learned, p = 3 is learned more "
        "often than from one that did not ([reading] of P5's split of its runs into successes and "
        "failures before fine-tuning)",
        "standard",
        "init_source",
        "higher",
        MODADD,
        experiment="paper/p5_curriculum",
        paper="seen in its figures; no number",
    ),
    # the suite's own question on P5's sandbox, one row per variant at its primary reading: does
    # conditioning shorten the plateau? No paper asks it, so no paper's number; judged from seed
    # sets (launch/analysis/seed_verdicts.py), never from run records
    *(
        Claim(
            f"P5-{variant}",
            "P5",
            f"`{variant}` shortens the time P5's sandbox takes to learn (the suite's question; "
            "no paper asks it)",
            variant,
            "learns_first",
            "lower",
            MODADD,
            experiment="paper/p5",
            paper="not asked",
            margin=SHARE_MARGIN,
            primary=primary,
        )
        for variant, primary in (
            ("precond", "precond"),
            ("spectral", "spectral_qkv"),
            ("cond_init", "cond_init_per_head"),
            ("cond_tokens", "cond_tokens_block"),
            ("mimetic", "mimetic"),
        )
    ),
]


@dataclass(frozen=True)
class TestedClaim:
    """A claim that needs no training, with the test that asserts it and what it found."""

    source: str
    statement: str
    test: str
    finding: str


THEOREMS = "tests/conditioning/test_theorems.py"
CHECKED_BY_TESTS: list[TestedClaim] = [
    TestedClaim(
        "P2",
        "Thm 3.8: κ(W + λI) < κ(W) for λ ≥ 2",
        f"{THEOREMS}::test_thm_3_8_*",
        "reproduced in its regime (‖W‖₂ ≤ 1, κ(W) > (λ+1)/(λ−1): then κ(W + λI) ≤ (λ+1)/(λ−1)); "
        "contradicted outside it: W = −λI + E, λ = 0.5, and semi-orthogonal W (P4's own W_Q, W_K) "
        "whose κ = 1 the shift raises",
    ),
    TestedClaim(
        "P4",
        "Prop 3.2: conditioned initialization gives a smaller B(J) than Gaussian or uniform",
        f"{THEOREMS}::test_prop_3_2_*, tests/conditioning/test_init_kappa.py",
        "reproduced against inits of the same weight scale (Gaussian 1/√D, uniform ±√(3/D): lower in "
        "19/20 random draws and 8/8 ViT token sets); contradicted against smaller ones (PyTorch's "
        "uniform ±1/√D: larger B(J), median ratio 2.9–4.5: the larger weights sharpen P and κ(Λ(P)) "
        "grows); against timm's trunc-normal 0.02 on a ViT, no consistent direction (7 of 20 seeds "
        "lower at block 0)",
    ),
    TestedClaim(
        "P1",
        "the preconditioner lowers the condition number of the attention output",
        f"{THEOREMS}::test_precond_*",
        "not in general (our reading, row equilibration): κ(CA) < κ(A) in 86% of random heads "
        "(N16, D32, d8), 58% at ViT-Ti's N197, 50% with small weights; a counter-example "
        "(κ(A) = 1.02, κ(CA) = 1.42) is asserted",
    ),
]


#: the key of :func:`parse_margins`' result that holds the δ of every comparison no claim names
#: (``--margin 0.01`` without a claim: :func:`launch.analysis.verdicts.effects`)
ANY_ROW = "*"


def parse_margins(items: list[str], any_row: bool = False) -> dict[str, float]:
    """``["P2-image=0.01"]`` as ``{"P2-image": 0.01}``; with ``any_row``, a bare number (``"0.01"``)
    is the δ of every comparison no claim names, under :data:`ANY_ROW`. A ValueError naming what
    is wrong."""
    keys = [c.key for c in CLAIMS]
    share_claims = {c.key for c in CLAIMS if c.measure in SHARE_MEASURES}
    margins = {}
    for item in items:
        key, _, value = item.partition("=") if "=" in item or not any_row else (ANY_ROW, "", item)
        if any_row and key == ANY_ROW:
            margins[key] = positive_margin(item, value, "give a number (0.01) or CLAIM=DELTA")
            continue
        if key not in keys:
            raise ValueError(f"--margin {item}: no claim {key!r} (claims: {', '.join(keys)})")
        margins[key] = positive_margin(item, value, f"{value!r} is not a number (e.g. {key}=0.01)")
        if key in share_claims and not margins[key] < 0.5:
            raise ValueError(
                f"--margin {item}: {key}'s margin is a share's distance from one half, below 0.5"
            )
    return margins


def positive_margin(item: str, value: str, not_a_number: str) -> float:
    """``value`` of ``--margin item`` as a positive number; a ValueError saying ``not_a_number``
    where it is none, or that a margin is a positive effect size."""
    try:
        margin = float(value)
    except ValueError:
        raise ValueError(f"--margin {item}: {not_a_number}") from None
    if not margin > 0:
        raise ValueError(f"--margin {item}: a margin is a positive effect size")
    return margin
