"""PPO (Schulman et al. 2017) with GAE, for continuous and discrete actions,
synchronous or asynchronous with V-trace-style staleness corrections."""

from ..lazy import exports
from .config import PPOConfig
from .entries import ENTRIES

# JAX behind these: imported on first use, so the settings and ENTRIES load without it
__getattr__ = exports(__name__, {
    "PPO": "algorithm",
    "export_ppo": "export",
    "TrainingState": "learning",
    "act": "learning",
    "act_with_log_prob": "learning",
    "actor_params": "learning",
    "init": "learning",
    "make_update": "learning",
    "clipped_surrogate": "losses",
    "effective_sample_size": "losses",
    "gae": "losses",
    "gae_loop": "losses",
    "vtrace": "losses",
    "vtrace_loop": "losses",
    "PPONetworks": "networks",
    "make_networks": "networks",
})

__all__ = ["ENTRIES", "PPO", "PPOConfig", "PPONetworks", "TrainingState", "act", "act_with_log_prob", "actor_params",
           "clipped_surrogate", "effective_sample_size", "export_ppo", "gae", "gae_loop", "init", "make_networks",
           "make_update", "vtrace", "vtrace_loop"]
