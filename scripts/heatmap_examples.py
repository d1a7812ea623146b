"""Draw the heat maps docs/heatmaps.md shows, one per kind of result, from the made-up
results in tests/fixtures/heatmaps:

    python scripts/heatmap_examples.py [OUTPUT_FOLDER]    (default: docs/)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ncclbench.results.heatmap import plot_heatmap

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "heatmaps"
EXAMPLES = {  # image -> the result it is drawn from
    "heatmap_pairs.png": "pairs.json",
    "heatmap_preflight.png": "preflight-report.json",
    "heatmap_fleet.png": "fleet-report.json",
    "heatmap_p2p.png": "p2p.json",
}
DPI = 72  # keeps each image under 100 KB


def main(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for image, source in EXAMPLES.items():
        doc = json.loads((FIXTURES / source).read_text())
        plot_heatmap(doc, folder / image, dpi=DPI)
        print(f"{folder / image}: {(folder / image).stat().st_size // 1024} KB from {source}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs")
