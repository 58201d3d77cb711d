"""The run's page and GIF: every frame behind a slider, the spikes in a table, no network.

``<run_dir>/sandbox/index.html`` is one self-contained file (inline CSS and JavaScript)
that references the frames relatively (``frames/step_*.png``), so the folder can be
copied or served anywhere. ``training.gif`` is the frames as an animation (Pillow).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from PIL import Image

from src.engine.record import atomic


def spike_events(rows: list[dict[str, Any]], up_to: int | None = None, gap: int = 50) -> list[dict[str, Any]]:
    """Spike steps less than ``gap`` steps apart, as events (P5's spikes come in bursts): first
    and last step, peak loss and ratio, the largest total gradient norm and RMSNorm
    eigenvalue logged at the event's spike steps."""
    events: list[dict[str, Any]] = []
    for r in rows:
        if "spike/loss" not in r or (up_to is not None and r["step"] > up_to):
            continue
        jac = max((v for k, v in r.items() if k.startswith("norm_jacobian/")), default=float("nan"))
        grad = r.get("spike/grad_norm/total", float("nan"))
        if events and r["step"] - events[-1]["last"] < gap:
            e = events[-1]
            e["last"] = r["step"]
            e["loss"] = max(e["loss"], r["spike/loss"])
            e["ratio"] = max(e["ratio"], r["spike/ratio"])
            e["grad_norm"] = max(e["grad_norm"], grad)
            e["norm_jacobian"] = max(e["norm_jacobian"], jac)
        else:
            events.append(
                {
                    "first": r["step"],
                    "last": r["step"],
                    "loss": r["spike/loss"],
                    "median": r["spike/median"],
                    "ratio": r["spike/ratio"],
                    "grad_norm": grad,
                    "norm_jacobian": jac,
                }
            )
    return events


def write_page(sandbox_dir: Path, frames: list[Path], title: str, rows: list[dict[str, Any]]) -> Path:
    """Write ``index.html`` for ``frames`` (paths inside ``sandbox_dir``); returns its path."""
    names = [f.relative_to(sandbox_dir).as_posix() for f in frames]
    events = spike_events(rows)
    spike_rows = "".join(
        f"<tr><td>{e['first']}–{e['last']}</td><td>{e['loss']:.3g}</td><td>{e['median']:.3g}</td>"
        f"<td>{e['ratio']:.3g}</td><td>{e['grad_norm']:.3g}</td><td>{e['norm_jacobian']:.3g}</td></tr>"
        for e in events
    )
    spikes = (
        "<table><tr><th>steps</th><th>peak loss</th><th>running median</th><th>peak ratio</th>"
        f"<th>peak gradient norm</th><th>peak RMSNorm λ<sub>max</sub></th></tr>{spike_rows}</table>"
        if events
        else "<p>No loss spike detected.</p>"
    )
    gif = (
        '<p><img src="training.gif" alt="training animation"></p>'
        if (sandbox_dir / "training.gif").exists()
        else ""
    )
    page = PAGE.format(
        title=html.escape(title),
        frames=json.dumps(names),
        first=html.escape(names[-1] if names else ""),
        spikes=spikes,
        gif=gif,
        count=len(names),
    )
    path = sandbox_dir / "index.html"
    atomic.write_text(path, page)
    return path


def write_gif(frames: list[Path], path: Path, ms_per_frame: int = 120) -> Path:
    """The frames as an animated GIF (the last frame held three times as long)."""
    images = [Image.open(f).convert("RGB") for f in frames]
    palette = images[-1].quantize(colors=255, method=Image.Quantize.MEDIANCUT)
    quantized = [im.quantize(palette=palette, dither=Image.Dither.NONE) for im in images]
    durations = [ms_per_frame] * (len(images) - 1) + [ms_per_frame * 3]
    with atomic.writing(path) as handle:
        quantized[0].save(
            handle,
            format="GIF",
            save_all=True,
            append_images=quantized[1:],
            duration=durations,
            loop=0,
            optimize=True,
        )
    return path


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 1em 2em; }}
#frame {{ max-width: 100%; border: 1px solid #ccc; }}  /* natural size where the window allows */
table {{ border-collapse: collapse; font-size: 0.9em; }}
td, th {{ border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }}
.controls {{ margin: 0.5em 0; }}
</style></head>
<body>
<h1>{title}</h1>
<p>Each frame: every layer's 2-D cloud and the query's attention at its step, then the curves up to
that step (x axis: optimizer steps; the vertical line marks the frame's step). On the loss and
accuracy panels the stages found so far are shaded (plateaus grey, rises green) and the loss spikes
marked. Drag the slider or press play.</p>
<div class="controls">
<button id="play">play</button>
<input id="slider" type="range" min="0" max="{count}" value="{count}" style="width: 60%">
<span id="label"></span>
</div>
<img id="frame" src="{first}" alt="frame">
<h2>Loss spikes</h2>
{spikes}
<h2>Animation</h2>
{gif}
<script>
const frames = {frames};
const img = document.getElementById("frame"), slider = document.getElementById("slider");
const label = document.getElementById("label"), play = document.getElementById("play");
slider.max = Math.max(frames.length - 1, 0); slider.value = slider.max;
function show(i) {{ if (!frames.length) return; img.src = frames[i]; label.textContent = frames[i]; }}
slider.oninput = () => show(+slider.value);
let timer = null;
play.onclick = () => {{
  if (timer) {{ clearInterval(timer); timer = null; play.textContent = "play"; return; }}
  if (+slider.value >= frames.length - 1) slider.value = 0;
  play.textContent = "pause";
  timer = setInterval(() => {{
    if (+slider.value >= frames.length - 1) {{ play.onclick(); return; }}
    slider.value = +slider.value + 1; show(+slider.value);
  }}, 150);
}};
show(+slider.value);
</script>
</body></html>
"""
