"""CommInsight's MoE expert-parallel reporter: DeepXTrace's `Diagnose` API (issue 21).

`from comminsight_moe.diagnose import Diagnose` in place of `from deepxtrace.diagnose import
Diagnose`: the same constructor, stats tensors for DeepEP's low-latency kernels or Ascend MC2's
`performance_info`, `diagnose_ll_sync` / async mode and the static `diagnose_matrix`; each rank
writes its own rows into its CommInsight stream, and `comminsight-agent` analyses them. No
collectives, never raises into the training loop. See ../README.md.
"""

from ._matrix import diagnose_matrix
from .diagnose import Diagnose

__all__ = ["Diagnose", "diagnose_matrix"]
