"""What a COCO annotation file says, read without mmdet: its category names in label order.

Both the task (:meth:`.task.CocoInstanceSegmentation.prepare_data`, ``task.classes=from_file``, run
where the detection stack may be missing) and mmdet's checked dataset (:class:`.dataset.SuiteCocoDataset`)
read it, so it lives below both.
"""

from __future__ import annotations

import json
from pathlib import Path

from src.errors import DataError


def category_names(ann_file: Path) -> list[str]:
    """The ``categories`` of a COCO annotation file, by id (mmdet's label order)."""
    try:
        categories = json.loads(Path(ann_file).read_text()).get("categories") or []
        return [c["name"] for c in sorted(categories, key=lambda c: c["id"])]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        reason = f"{type(error).__name__}: {error}"
        raise DataError(f"{ann_file}: cannot read its categories ({reason})") from error
