"""Tiny stand-in for gymnasium (not installed here): make() gives a CartPole-shaped
environment (4 floats, 2 actions) with simple deterministic dynamics, episodes of at most
RW_EPISODE_LEN steps (default 20), seeded by reset(seed=...)."""
import os

import numpy as np


class _Spec:
    reward_threshold = 475.0


class _Space:
    def __init__(self, n=None, shape=None):
        self.n, self.shape = n, shape


class _CartPole:
    spec = _Spec()
    observation_space = _Space(shape=(4,))
    action_space = _Space(n=2)

    def __init__(self):
        self.rng = np.random.default_rng(0)
        self.max_len = int(os.environ.get("RW_EPISODE_LEN", "20"))
        self.state, self.t = np.zeros(4), 0

    def reset(self, seed=None, **kw):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.state, self.t = self.rng.uniform(-0.05, 0.05, 4), 0
        return self.state.astype(np.float32), {}

    def step(self, action):
        self.t += 1
        push = 0.1 if int(action) == 1 else -0.1
        x, v, th, w = self.state
        w = w + 0.5 * th - push
        self.state = np.array([x + v, v + push, th + 0.1 * w, w])
        terminated = bool(abs(self.state[2]) > 0.5)
        truncated = self.t >= self.max_len
        return self.state.astype(np.float32), 1.0, terminated, truncated, {}

    def render(self):
        pass

    def close(self):
        pass


def make(name, *a, **k):
    return _CartPole()
