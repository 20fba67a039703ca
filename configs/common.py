"""The config sections every experiment shares: laplax.presets, under the name the configs here
import it by (`from configs import common`; its docstring lists the sections). They live in the
package so that an installed laplax builds its default run configs (laplax.convert) without this
repository; a config written outside it imports `from laplax import presets`.

This module is laplax.presets itself (not a copy of its names): `configs.common is
laplax.presets`, so there is one home for every section and one SHARED.
"""

import sys

from laplax import presets

sys.modules[__name__] = presets
