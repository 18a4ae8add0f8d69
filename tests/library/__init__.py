"""The library lessons import (utils/*.py, utils/presets/): known values, and equality with TRL, PEFT, bitsandbytes."""
