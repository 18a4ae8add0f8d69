"""Shared helpers for the post-training course lessons.

Kept deliberately small: only what several lessons reuse lives here. Import the
submodules you need (``from utils import data, rewards, evaluation``); the three
functions every lesson uses (``record``, ``show_records``, ``read_records``, ``headline``) are re-exported at the
top level.
"""
import logging as _logging
import warnings as _warnings

from .headlines import headline
from .records import read_records, record, register_magic, show_records

register_magic()   # %%results, the first line of every lesson's results cell

__all__ = ["headline", "record", "read_records", "show_records"]

# Messages a student cannot act on, silenced narrowly (by message and module), never globally:
# - tqdm in a kernel without ipywidgets falls back to text bars (that is fine);
# - peft still asks transformers 5.23 for the deprecated `is_gradient_checkpointing`, and TRL's generation
#   (trl/models/utils.py) switches checkpointing off and on with the deprecated `gradient_checkpointing_*`;
# - bitsandbytes' optional CPU kernel lives on the Hub; without it bitsandbytes uses its own
#   implementation (same results), and says so at every import;
# - TRL calls `rollout_func` experimental at every GRPOTrainer; lesson 04 explains why the tiny
#   preset passes one (utils.rl.decode_rollout) and tests/library/test_rl.py checks it.
_warnings.filterwarnings("ignore", message="IProgress not found", module="tqdm")
_warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
_warnings.filterwarnings("ignore", message="`gradient_checkpointing_(enable|disable)` is deprecated",
                         category=FutureWarning)
_warnings.filterwarnings("ignore", message="You are using 'rollout_func'", category=UserWarning)
_logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
    lambda rec: "kernels-community" not in rec.getMessage())
