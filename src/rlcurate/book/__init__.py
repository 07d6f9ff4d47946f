"""Helpers shared by the chapters: run profiles, the house plot style, and recorded values.

Every chapter starts with one cell tagged ``parameters``::

    PROFILE = rlcurate.book.profile()   # RLCURATE_PROFILE: smoke | cpu (default) | gpu
    SEED = 0

papermill overrides it in the tests; nbval and jupyter-book read the environment variable. A chapter
picks its sizes with :func:`by_profile` and stores the numbers a test should check with :func:`record`.
"""

from rlcurate.book.profiles import PROFILES, by_profile, gpu_cells, profile
from rlcurate.book.gpu_runs import CHAPTER_GPU_RUNS, chapter_gpu_configs
from rlcurate.book.records import MIME_TYPE, read_records, record
from rlcurate.book.style import COLORS, use_style
from rlcurate.book.seeding import seed_everything
from rlcurate.book.scratch import scratch_dir

__all__ = ["PROFILES", "profile", "by_profile", "gpu_cells", "CHAPTER_GPU_RUNS", "chapter_gpu_configs", "record",
           "read_records", "MIME_TYPE", "use_style", "COLORS", "seed_everything",
           "scratch_dir"]
