"""PPO (Schulman et al. 2017) with GAE, for continuous and discrete actions,
synchronous or asynchronous with V-trace-style staleness corrections."""

from .algorithm import ENTRIES, PPO
from .config import PPOConfig
from .export import export_ppo
from .learning import TrainingState, act, act_with_log_prob, actor_params, init, make_update
from .losses import clipped_surrogate, effective_sample_size, gae, gae_loop, vtrace, vtrace_loop
from .networks import PPONetworks, make_networks

__all__ = ["ENTRIES", "PPO", "PPOConfig", "PPONetworks", "TrainingState", "act", "act_with_log_prob", "actor_params",
           "clipped_surrogate", "effective_sample_size", "export_ppo", "gae", "gae_loop", "init", "make_networks",
           "make_update", "vtrace", "vtrace_loop"]
