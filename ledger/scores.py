"""One cell of a job's score matrix, worked out once for every reader: `ledger report` (a
terminal table) and the web view's matrix (`ledger.web`) show the same numbers because both
call `cell_summary` on the opinions `Store.opinions` returns, which `report --json` prints."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Judges whose scores on one dimension differ by this much or more disagree (the matrix marks them).
DISAGREEMENT = 2


@dataclass(frozen=True)
class CellSummary:
    """A cell: its score (one opinion's, or the mean of its samples' scores), how many scores,
    their spread (population standard deviation), and the opinions without a score."""

    opinions: int
    scores: tuple[int, ...]
    failed: int
    unparsed: int

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.scores) if self.scores else None

    @property
    def spread(self) -> float | None:
        return statistics.pstdev(self.scores) if self.scores else None

    @property
    def sampled(self) -> bool:
        return self.opinions > 1

    def score_text(self) -> str:
        """The score as `data-score` carries it: the integer of one opinion, the mean (4 decimals
        at most) of samples, empty when no opinion gave one."""
        mean = self.mean
        if mean is None:
            return ""
        if not self.sampled:
            return str(self.scores[0])
        return f"{mean:.4f}".rstrip("0").rstrip(".")


def cell_text(cell: CellSummary, marked: Callable[[str], str] = str) -> str:
    """What a cell shows, in the terminal report and on the web page alike: the score, or with
    samples their mean (n, sd), failed and unparsed ones counted beside it (`marked` dresses those
    words: the terminal colours them)."""
    if cell.opinions == 0:
        return "-"
    if not cell.sampled:
        if cell.scores:
            return str(cell.scores[0])
        return marked("unparsed" if cell.unparsed else "failed")
    said = f"{cell.mean:.2f} (n={len(cell.scores)}, sd {cell.spread:.2f})" if cell.scores else "-"
    marks = [marked(f"{n} {what}") for n, what in ((cell.failed, "failed"), (cell.unparsed, "unparsed")) if n]
    return " ".join([said, *marks])


def cell_summary(opinions: Iterable[Mapping[str, Any]]) -> CellSummary:
    """A cell's opinions summed up: a NULL score with a parse error is unparsed, without one failed."""
    found = list(opinions)
    return CellSummary(
        opinions=len(found),
        scores=tuple(int(o["score"]) for o in found if o["score"] is not None),
        failed=sum(1 for o in found if o["score"] is None and not o["parse_error"]),
        unparsed=sum(1 for o in found if o["score"] is None and o["parse_error"]),
    )


def cells_of(opinions: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """Opinions grouped by (agent, dimension), in the order given."""
    cells: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for opinion in opinions:
        cells.setdefault((str(opinion["agent"]), str(opinion["dimension"])), []).append(opinion)
    return cells


def disagree(summaries: Iterable[CellSummary]) -> bool:
    """Whether a dimension's judges differ by `DISAGREEMENT` or more (cells without a score left out)."""
    means = [s.mean for s in summaries if s.mean is not None]
    return len(means) > 1 and max(means) - min(means) >= DISAGREEMENT
