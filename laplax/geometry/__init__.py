"""Token geometry: streaming statistics (stats) and the metrics built on them (metrics).

Plots live elsewhere; this package only computes numbers.
"""
from laplax.geometry.metrics import cdnv
from laplax.geometry.metrics import cdnv_from_stats
from laplax.geometry.metrics import components_for_variance
from laplax.geometry.metrics import effective_rank
from laplax.geometry.metrics import neural_collapse
from laplax.geometry.metrics import pooled_spectrum
from laplax.geometry.metrics import spectral_decay
from laplax.geometry.metrics import spectrum
from laplax.geometry.metrics import variance_decomposition
from laplax.geometry.metrics import within_sequence_cosine
from laplax.geometry.stats import accumulation_dtype
from laplax.geometry.stats import AgreementStats
from laplax.geometry.stats import ClassStats
from laplax.geometry.stats import CosineStats
from laplax.geometry.stats import CovarianceStats
from laplax.geometry.stats import NeuralCollapseStats
from laplax.geometry.stats import Sum
from laplax.geometry.stats import VarianceStats

__all__ = [
    "AgreementStats", "ClassStats", "CosineStats", "CovarianceStats", "NeuralCollapseStats",
    "Sum", "VarianceStats", "accumulation_dtype", "cdnv", "cdnv_from_stats",
    "components_for_variance", "effective_rank", "neural_collapse", "pooled_spectrum",
    "spectral_decay", "spectrum",
    "variance_decomposition", "within_sequence_cosine",
]
