"""Section 5's architecture figure (paper Figure 1 as built here), drawn again into the notebook's markdown.

    python tests/tools/draw_architecture.py     # rewrites the attachment `architecture.png` of section 5's first cell

The figure is a fixed picture (the paper's names, and beneath them the code that builds each box), so the notebook
carries it as an image attached to its markdown instead of 36 lines of drawing code a reader would scroll past. Edit
the boxes here when the code they name changes, and run this again.
"""

from __future__ import annotations

import base64
import io
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import nbformat
from matplotlib.patches import FancyBboxPatch

NOTEBOOK = Path(__file__).resolve().parents[2] / "transformer.ipynb"
NAME = "architecture.png"


def draw_architecture() -> plt.Figure:
    """The encoder-decoder of section 5: the paper's names, and (grey) the code, masks and shapes; green: residuals."""
    ax = plt.figure(figsize=(8.8, 6.8)).add_axes((0, 0, 1, 0.95), xlim=(0.3, 10.5), ylim=(0, 10), xticks=[], yticks=[])
    ax.set(frame_on=False, title="The Transformer as built here: post-norm, one matrix E; green: residual connections")
    emb, att, ffn, nrm, out = "#fde2c8", "#ffd1dc", "#cfe8ff", "#fff5b8", "#e4dcf4"  # box colours, by kind (green is kept for residuals)
    arrow, add_norm = {"arrowstyle": "->"}, ("Add & Norm", "PostNormResidual: LayerNorm(x + Sublayer(x))", nrm)
    encoder = [("Inputs (German)", "src ids (B, S) ... <eos>", emb),
               ("Input Embedding + Positional Encoding", "embed(): E[ids]·√d_model + PE → (B, S, d_model)", emb),
               ("Multi-Head Attention", "MultiHeadAttention; mask: padding_mask(src)", att), add_norm,
               ("Feed Forward", "FeedForward: max(0, xW1 + b1)W2 + b2", ffn), add_norm]
    decoder = [("Outputs (shifted right)", "tgt_in ids (B, T) = <bos> + the target, less its last", emb),
               ("Output Embedding + Positional Encoding", "embed(): the same E and PE → (B, T, d_model)", emb),
               ("Masked Multi-Head Attention", "MultiHeadAttention, causal=True: query i sees keys 0..i", att), add_norm,
               ("Multi-Head Attention", "q: decoder; k, v: memory; padding_mask(src)", att), add_norm,
               ("Feed Forward", "FeedForward", ffn), add_norm,
               ("Linear", "logits = o Eᵀ, o the last layer's output: (B, T, V)", out),
               ("Softmax → Output Probabilities", "label_smoothed_loss; greedy_decode, beam_search", out)]
    for x, top, name, stack in ((2.6, 5.95, "Encoder", encoder), (8.2, 7.8, "Decoder", decoder)):
        for i, (paper, code, kind) in enumerate(stack):
            y = 0.35 + 0.9 * i + 0.5 * (i > 1) + 0.45 * (i > 7)  # a gap below and above the layers' frames
            ax.add_patch(FancyBboxPatch((x - 2, y - 0.3), 4, 0.6, boxstyle="round,pad=0.04", fc=kind, ec="0.3"))
            ax.text(x, y + 0.1, paper, ha="center", va="center", fontsize=9, weight="bold")
            ax.text(x, y - 0.14, code, ha="center", va="center", fontsize=7.5, color="0.3")
            if kind in (att, ffn):  # green: the residual, from the sub-layer's input to its PostNormResidual
                ax.plot([x, x - 2.15, x - 2.15, x - 2.06], [y - 0.42, y - 0.42, y + 0.9, y + 0.9], color="tab:green",
                        marker=">", markevery=[3], ms=5)  # the marker: an arrowhead
        ax.plot([x, x], [0.35, y], color="0.25", zorder=0)  # the flow, bottom to top, behind the boxes
        ax.add_patch(plt.Rectangle((x - 2.35, 2.0), 4.6, top - 2.1, fill=False, ec="0.5", ls=":"))
        ax.text(x - 2.3, top, f"{name} layer × N ({name}Layer)", fontsize=9, weight="bold")
    ax.annotate("memory", (6.2, 4.45), (4.7, 5.3), va="bottom", fontsize=9, arrowprops={**arrow, "relpos": (0, 0)})
    for end, start in (((4.6, 1.3), (0, 0.5)), ((6.2, 1.3), (1, 0.5)), ((6.2, 8.5), (0.5, 1))):  # one box, 3 arrows
        ax.annotate("one matrix E\n(V × d_model)\nused 3 times", end, (5.4, 1.3), ha="center", va="center", size=8.5,
                    color="darkred", bbox={"fc": "w", "ec": "darkred", "ls": "--"}, arrowprops={**arrow, "ls": "--",
                    "color": "darkred", "relpos": start, "connectionstyle": "angle,angleA=90,angleB=180"})
    return ax.figure


def png(figure: plt.Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")  # as Colab draws inline figures
    return buffer.getvalue()


def main() -> int:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("## 5. "))
    cell["attachments"] = {NAME: {"image/png": base64.b64encode(png(draw_architecture())).decode()}}
    if f"(attachment:{NAME})" not in cell.source:
        cell.source += f"\n\n![The Transformer as built here](attachment:{NAME})"
    nbformat.write(nb, NOTEBOOK)
    print(f"{NOTEBOOK.name}: {NAME} attached to the cell {cell.source.splitlines()[0]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
