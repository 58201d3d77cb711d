"""What ``python -m launch.analysis.dashboard`` saves: a W&B workspace and a report, as wandb_workspaces
models.

The runs are grouped by the flat config keys :func:`src.engine.record.tracking.run_config` writes
(``variant``, then ``variant_options``; panels by ``variant_label``, the two in one string), so a
line is the mean over seeds of one variant with one option set, with a band. The κ and entropy
panels plot the conditioning monitor's model-wide medians (:mod:`src.conditioning.monitor`).

:func:`spec_json` is the library's own serialisation (the models it sends when it saves) and
:func:`load_spec` reads it back into the library's models.
"""

from __future__ import annotations

from typing import Any

import wandb_workspaces.reports.v2 as wr
import wandb_workspaces.workspaces as ws
from wandb_workspaces.reports.v2 import internal as report_models
from wandb_workspaces.workspaces import internal as workspace_models

from launch.analysis.paper import PAPER

#: The conditioning monitor's model-wide κ medians (``kappa/<quantity>/median``) and P's entropy.
KAPPA_KEYS = [f"kappa/{q}/median" for q in ("W_Q", "W_K", "W_V", "X", "P", "A", "tokens")]
ENTROPY_KEYS = ["entropy/P/median", "entropy/P/max"]
#: The config keys the runs are grouped by (the runs table), and the one key panels group by.
GROUP_KEYS = ["variant", "variant_options"]
PANEL_GROUP = "variant_label"


def filters(task: str, sweep: str | None) -> ws.And:
    """Runs of ``task`` (the config's ``task_name``), of one sweep (``sweep_name``) when given."""
    chosen = [ws.Config("task_name") == task]
    return ws.And(*chosen, *([ws.Config("sweep_name") == sweep] if sweep else []))


def _line(key: str, log_y: bool = False) -> wr.LinePlot:
    """``key`` over steps: per group the mean over seeds, the band one standard deviation."""
    group = wr.Config(PANEL_GROUP)
    return wr.LinePlot(
        title=key, y=[key], groupby=group, groupby_aggfunc="mean", groupby_rangefunc="stddev", log_y=log_y
    )


def _final_bar(metric: str) -> wr.BarPlot:
    """The final ``metric`` per variant and option set: mean over seeds, error bar the stderr."""
    return wr.BarPlot(
        title=f"final {metric} per variant",
        metrics=[f"final/{metric}"],
        groupby=wr.Config(PANEL_GROUP),
        groupby_aggfunc="mean",
        groupby_rangefunc="stderr",
    )


def workspace(entity: str, project: str, task: str, metric: str, sweep: str | None) -> ws.Workspace:
    """The saved view: the main metric, the final bar chart, κ and entropy, grouped by variant."""
    name = f"{task} · {sweep}" if sweep else task
    return ws.Workspace(
        entity=entity,
        project=project,
        name=f"conditioned attention: {name}",
        sections=[
            ws.Section(name="main metric", is_open=True, panels=[_line(metric), _final_bar(metric)]),
            ws.Section(name="kappa", is_open=True, panels=[_line(k, log_y=True) for k in KAPPA_KEYS]),
            ws.Section(name="entropy", is_open=True, panels=[_line(k) for k in ENTROPY_KEYS]),
        ],
        runset_settings=ws.RunsetSettings(
            filters=filters(task, sweep),
            groupby=[ws.Config(k) for k in GROUP_KEYS],
            pinned_columns=[f"config:{PANEL_GROUP}", f"summary:final/{metric}", f"summary:{metric}"],
        ),
    )


def paper_table(task: str) -> str:
    """The papers' numbers for ``task`` (:mod:`launch.analysis.paper`) as a markdown table."""
    rows = [n for n in PAPER if n.task == task]
    if not rows:
        return f"The papers report no number for `{task}`; the panels below hold ours alone."
    head = "| backbone | variant | metric | paper | paper's baseline | gain | source |\n" + "|---" * 7 + "|"
    lines = [
        f"| {n.backbone} | {n.variant} | {n.metric} | {n.value:.4g} | {n.baseline:.4g} | "
        f"{n.value - n.baseline:+.3g} | {n.source} |"
        for n in rows
    ]
    return "\n".join([head, *lines])


def report(
    entity: str, project: str, task: str, metric: str, sweep: str | None, name_project: bool = True
) -> wr.Report:
    """The papers' table, then ours: the final metric per variant and the runs, in one panel grid.
    ``name_project=False`` leaves the runset's project to the report's (the library looks the
    project's id up over the network when a runset names one; a dry run must not)."""
    where = {"entity": entity, "project": project} if name_project else {}
    runset = wr.Runset(
        **where,
        name=f"our runs: {task}" + (f", sweep {sweep}" if sweep else ""),
        filters=filters(task, sweep),
        groupby=[f"config.{k}" for k in GROUP_KEYS],
        pinned_columns=[f"config:{PANEL_GROUP}.value", f"summary:final/{metric}", f"summary:{metric}"],
    )
    intro = (
        f"Main metric `{metric}`: the papers' numbers (fractions, as the suite logs them) and, "
        f"below, ours per variant and option set (mean over seeds; `{metric}` in the runs table "
        "is each run's best, `final/` its last validation)."
    )
    return wr.Report(
        entity=entity,
        project=project,
        title=f"Conditioned attention: {task}" + (f" ({sweep})" if sweep else ""),
        blocks=[
            wr.MarkdownBlock(text=intro),
            wr.H2(text="The papers"),
            wr.MarkdownBlock(text=paper_table(task)),
            wr.H2(text="Ours"),
            wr.PanelGrid(runsets=[runset], panels=[_final_bar(metric), _line(metric)]),
        ],
    )


def spec_json(view: ws.Workspace, rep: wr.Report) -> dict[str, Any]:
    """Both models as the library serialises them (camelCase, no nulls)."""
    dump = {"by_alias": True, "exclude_none": True, "mode": "json"}
    return {"workspace": view._to_model().model_dump(**dump), "report": rep._to_model().model_dump(**dump)}


def load_spec(spec: dict[str, Any]) -> tuple[ws.Workspace, wr.Report]:
    """The workspace and report that :func:`spec_json` wrote, read back through the library."""
    view = ws.Workspace._from_model(workspace_models.View.model_validate(spec["workspace"]))
    rep = wr.Report._from_model(report_models.ReportViewspec.model_validate(spec["report"]))
    return view, rep


def panel_metrics(view: ws.Workspace) -> dict[str, list[str]]:
    """Each panel's title and the metric keys it plots (a line plot's ``y``, a bar's ``metrics``)."""
    return {
        p.title: [getattr(m, "name", m) for m in (p.y if isinstance(p, wr.LinePlot) else p.metrics)]
        for section in view.sections
        for p in section.panels
    }
