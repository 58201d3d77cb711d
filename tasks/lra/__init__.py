"""Long Range Arena (Tay et al., 2021): ListOps, Text, Retrieval, Image and Pathfinder, read
from the official release's files, plus generators for the two synthetic tasks.

Data layout under ``paths.data_dir`` (each task's ``folder`` can point elsewhere):

| task | files |
| --- | --- |
| ``lra_listops`` | ``listops-1000/basic_{train,val,test}.tsv`` |
| ``lra_text`` | ``aclImdb/{train,test}/{neg,pos}/*.txt`` or ``imdb/`` (Hugging Face copy) |
| ``lra_retrieval`` | ``tsv_data/new_aan_pairs.{train,eval,test}.tsv`` |
| ``lra_image`` | ``cifar-10-batches-py/{data_batch_1..5,test_batch}`` |
| ``lra_pathfinder`` | ``pathfinder32/curv_contour_length_14/{metadata/*.npy,imgs/*/*.png}`` |
| ``lra_listops_small`` | ``listops_small/basic_{train,val,test}.tsv``, generated on first use |

``python -m tasks.lra.generate {listops,pathfinder} <folder>`` writes a synthetic set in the
release's format.
"""

from .base import LRATask, Sequences, pad_batch
from .tasks import Image, ListOps, ListOpsSmall, Pathfinder, Retrieval, Text

__all__ = [
    "Image",
    "LRATask",
    "ListOps",
    "ListOpsSmall",
    "Pathfinder",
    "Retrieval",
    "Sequences",
    "Text",
    "pad_batch",
]
