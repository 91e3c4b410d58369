"""cute-autotune: an autotuning explorer for CuTe FlashAttention-forward kernels.

The package is a pipeline of stages, each a sub-package that imports only earlier ones
(tests/test_layering.py enforces it):

    model -> build -> launch -> measure -> store -> runtime -> tune -> cli

`import autotune` loads only the model stage; `attention()` loads the runtime path (model,
build, launch, store, SDPA), never the tuner, the GPU worker or Optuna.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_getattr
from .model.config import Config, InvalidConfig
from .model.problem import Problem
from .model.space import Space, families, load_space, supported_families, validate_config
from .model.target import Target, default_target, target_for_arch

if TYPE_CHECKING:  # imported lazily at run time (__getattr__), typed for checkers here
    from .build.compiler import BuildResult, compile_config, compile_many, lookup
    from .runtime.attention import attention, configure, explain
    from .runtime.kvcache import attention_with_kvcache
    from .runtime.sdpa_dropin import explain_sdpa, scaled_dot_product_attention, sdpa_dispatch
    from .runtime.transformers_attention import register_transformers
    from .tune.search import FamilyOutcome, SearchSettings, TuneOutcome
    from .tune.tuning import BestAnswer, best_config, tune

__all__ = [
    "BestAnswer",
    "BuildResult",
    "Config",
    "FamilyOutcome",
    "InvalidConfig",
    "Problem",
    "SearchSettings",
    "Space",
    "Target",
    "TuneOutcome",
    "attention",
    "attention_with_kvcache",
    "best_config",
    "configure",
    "compile_config",
    "compile_many",
    "default_target",
    "explain",
    "explain_sdpa",
    "families",
    "load_space",
    "lookup",
    "register_transformers",
    "scaled_dot_product_attention",
    "sdpa_dispatch",
    "supported_families",
    "target_for_arch",
    "tune",
    "validate_config",
]

from ._version import VERSION as __version__  # noqa: E402, F401 - the package attribute

# Names whose stage is loaded on first use: the runtime pulls in torch (and registers its
# custom op), the tuner Optuna; neither should be paid for by `import autotune`.
_LAZY = {
    "attention": "runtime.attention",
    "attention_with_kvcache": "runtime.kvcache",
    "explain": "runtime.attention",
    "configure": "runtime.attention",
    "scaled_dot_product_attention": "runtime.sdpa_dropin",
    "sdpa_dispatch": "runtime.sdpa_dropin",
    "explain_sdpa": "runtime.sdpa_dropin",
    "register_transformers": "runtime.transformers_attention",
    "BuildResult": "build.compiler",
    "compile_config": "build.compiler",
    "compile_many": "build.compiler",
    "lookup": "build.compiler",
    "FamilyOutcome": "tune.search",
    "SearchSettings": "tune.search",
    "TuneOutcome": "tune.search",
    "BestAnswer": "tune.tuning",
    "best_config": "tune.tuning",
    "tune": "tune.tuning",
}


__getattr__ = lazy_getattr(__name__, {name: (module, name) for name, module in _LAZY.items()})
