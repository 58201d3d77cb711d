"""mmdet's COCO dataset with the checks a user's own COCO-format data needs.

:class:`SuiteCocoDataset` (registered in mmdet's ``DATASETS``) reads exactly what mmdet's
``CocoDataset`` reads, and refuses, naming the file and what to change:

* an image whose ``file_name`` leaves the image folder (an absolute path, or ``..``): COCO's
  file names are relative to ``<split>2017/``, and a crafted annotation file must not make the
  loader read files elsewhere;
* an annotation file none of whose categories is one of the task's classes (mmdet would go on
  with no labelled object and fail later, on an empty concatenation).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath, PureWindowsPath

from mmdet.datasets import CocoDataset
from mmdet.registry import DATASETS

from src.errors import DataError

from .annotations import category_names


@DATASETS.register_module()
class SuiteCocoDataset(CocoDataset):
    """mmdet's ``CocoDataset``, checked (see the module docstring)."""

    def load_data_list(self) -> list[dict]:
        data = super().load_data_list()
        if not self.cat_ids:
            names = category_names(Path(self.ann_file))
            wanted = list(self.metainfo["classes"])
            raise DataError(
                f"{self.ann_file}: none of its {len(names)} categories ({_few(names)}) is one of the task's "
                f"{len(wanted)} classes ({_few(wanted)}): set task.classes=from_file to take the file's "
                "categories, or list the classes in task.classes"
            )
        return data

    def parse_data_info(self, raw_data_info: dict):
        image = raw_data_info["raw_img_info"]
        check_file_name(image["file_name"], image["img_id"], self.ann_file)
        return super().parse_data_info(raw_data_info)


def check_file_name(name: str, image_id: int, ann_file: str) -> None:
    """Refuse a ``file_name`` that is absolute or climbs out of the image folder."""
    escapes = (
        PurePosixPath(name).is_absolute()
        or PureWindowsPath(name).is_absolute()
        or PureWindowsPath(name).drive
        or ".." in PurePosixPath(name.replace("\\", "/")).parts
    )
    if escapes:
        raise DataError(
            f"{ann_file}: image {image_id} has file_name {name!r}, which leaves the image folder; COCO's "
            "file names are relative to the split's image folder (e.g. train2017/): fix that entry"
        )


def _few(names: list[str], shown: int = 6) -> str:
    return ", ".join(names[:shown]) + (f", … {len(names) - shown} more" if len(names) > shown else "")
